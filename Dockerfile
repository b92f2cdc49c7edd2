# circuitlab: multi-stage image on Debian 12 or 13, CPU or CUDA LibTorch,
# packages from the same list the set-up scripts and CI use (deploy/packages.txt).
#
#   docker build --network host -t circuitlab .                 # full build from source (~20 min on 2 cores)
#   scripts/dev-certs.sh secrets circuitlab && scripts/add-principal.sh me admin secrets/tokens.txt .
#   chmod a+r secrets/*                                         # the server runs as uid 999 in the image
#   docker run -d --name circuitlab -p 50051:50051 --read-only --tmpfs /tmp \
#       -v circuitlab-data:/data -v $PWD/secrets:/run/secrets:ro circuitlab
#   circuitlab --ca-cert secrets/ca.pem --token-file me.token whoami
#
# By default the server listens on 0.0.0.0:50051 with TLS (/run/secrets/server.pem,
# server.key) and principals (/run/secrets/tokens.txt), data and the audit log on
# the /data volume; see the README's "Deploy" section.
#
# `--target prebuilt` packs binaries already built on the host (deploy/.prebuilt/,
# made by `cmake --install build --prefix deploy/.prebuilt`) into the same runtime
# stage: what the `deploy` test tier builds, since a full source build does not
# fit CI's budget. The default target is the full build.

# The Debian release and LibTorch (deploy/packages.txt has both):
#   --build-arg BASE=bookworm|trixie   Debian 12 (LibTorch 1.13, the default) or 13 (LibTorch 2.6)
#   --build-arg TORCH=cpu|cuda         cuda: trixie only, contrib's libtorch-cuda 2.6 (CUDA 12.4)
#   docker build --network host --build-arg BASE=trixie --build-arg TORCH=cuda -t circuitlab:cuda .
# A CUDA image needs cuDNN and, at run time, the host's driver: Debian's
# nvidia-cudnn downloads cuDNN from NVIDIA while it installs, and its
# libcuda1 is the driver's own library, which `docker run --gpus all`
# (nvidia-container-toolkit) mounts from the host instead. Local stand-ins
# for either (deploy/cuda-placeholders.sh; README "GPUs") are installed
# first when they are in deploy/.cuda-debs/: the deploy tier builds the CUDA
# image here, with no GPU and no route to NVIDIA, with both.
ARG BASE=bookworm
ARG BASE_IMAGE=debian:${BASE}
ARG TORCH=cpu

FROM ${BASE_IMAGE} AS runtime-base
ARG TORCH
COPY deploy/packages.txt scripts/packages.sh deploy/install-packages.sh /tmp/install/
# A pattern, so that the build works without the folder (packages.txt makes
# the list non-empty).
COPY deploy/packages.txt deploy/.cuda-deb[s] /tmp/cuda-debs/
RUN /tmp/install/install-packages.sh "$TORCH" runtime && rm -rf /tmp/install
COPY examples/ /usr/share/circuitlab/examples/
RUN useradd --system --uid 999 --home /data circuitlab && mkdir -p /data && chown circuitlab /data
# Where the HEALTHCHECK (and any `docker exec circuitlab ...`) finds the server
# and the CA of its certificate; override when the server listens elsewhere.
ENV CIRCUITLAB_TARGET=127.0.0.1:50051 CIRCUITLAB_CA_CERT=/run/secrets/ca.pem
VOLUME /data
EXPOSE 50051 8080
# Health needs no token; the CLI checks the server's certificate (valid for
# 127.0.0.1) against the CA beside it.
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s \
  CMD ["circuitlab", "--timeout", "2", "health"]
ENTRYPOINT ["circuitlab-server"]
CMD ["--data", "/data", "--listen", "0.0.0.0:50051", "--http", "0.0.0.0:8080", \
     "--tls-cert", "/run/secrets/server.pem", "--tls-key", "/run/secrets/server.key", \
     "--auth-tokens-file", "/run/secrets/tokens.txt", "--audit-log", "/data/audit.jsonl"]

FROM runtime-base AS prebuilt
# PREBUILT: the `cmake --install` prefix whose bin/ this stage packs.
ARG PREBUILT=deploy/.prebuilt
# A pattern, not the directory: Docker's classic builder builds every stage
# before the target, this one too when the target is the full build, and must
# not fail when nothing was prebuilt (packages.txt is there so the list is
# never empty).
COPY deploy/packages.txt ${PREBUILT}/bi[n] /tmp/prebuilt/
RUN find /tmp/prebuilt -maxdepth 1 -name 'circuitlab*' -exec mv -t /usr/local/bin {} + && rm -rf /tmp/prebuilt
USER circuitlab

FROM ${BASE_IMAGE} AS build
ARG TORCH
WORKDIR /src
COPY deploy/packages.txt scripts/packages.sh deploy/install-packages.sh /tmp/install/
COPY deploy/packages.txt deploy/.cuda-deb[s] /tmp/cuda-debs/
RUN /tmp/install/install-packages.sh "$TORCH" build && rm -rf /tmp/install
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCIRCUITLAB_TESTS=OFF -DCIRCUITLAB_BENCH=OFF \
 && cmake --build /build \
 && cmake --install /build --prefix /opt/circuitlab

FROM runtime-base AS runtime
COPY --from=build /opt/circuitlab/bin/ /usr/local/bin/
USER circuitlab
