#!/bin/sh
# Installs deploy/packages.txt's packages for one stage inside an image being
# built (the Dockerfile's runtime and build stages), then cleans apt's lists.
#   deploy/install-packages.sh TORCH STAGE    # TORCH: cpu or cuda
# cuda: enables contrib and non-free (libtorch-cuda, the CUDA toolkit) and
# first installs the local stand-ins found in /tmp/cuda-debs (copied there
# from deploy/.cuda-debs/; deploy/cuda-placeholders.sh, docs/howto/debian-and-gpus.md).
set -eu
torch=$1 stage=$2
here=$(dirname "$0")
if [ "$torch" = cuda ]; then
  sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' \
    /etc/apt/sources.list.d/debian.sources
  if ls /tmp/cuda-debs/*.deb >/dev/null 2>&1; then dpkg -i /tmp/cuda-debs/*.deb; fi
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  $(PACKAGES_FILE="$here/packages.txt" "$here/packages.sh" --torch "$torch" "$stage")
rm -rf /var/lib/apt/lists/* /tmp/cuda-debs
