# circuitlab: multi-stage image on Debian bookworm, packages from the same
# list the set-up scripts and CI use (deploy/packages.txt).
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

# A base with CUDA (and a CUDA LibTorch under TORCH_PREFIX) for a GPU image:
#   docker build --build-arg BASE_IMAGE=<a bookworm-based CUDA image> --build-arg TORCH_PREFIX=/opt/libtorch .
# Untested here: Debian's LibTorch is CPU-only and none with CUDA can be
# installed on these machines (README "Deploy").
ARG BASE_IMAGE=debian:bookworm
ARG TORCH_PREFIX=

FROM ${BASE_IMAGE} AS runtime-base
COPY deploy/packages.txt scripts/packages.sh /tmp/
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      $(PACKAGES_FILE=/tmp/packages.txt /tmp/packages.sh runtime) \
 && rm -rf /var/lib/apt/lists/* /tmp/packages.*
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
# A pattern, not the directory: Docker's classic builder builds every stage
# before the target, this one too when the target is the full build, and must
# not fail when nothing was prebuilt (packages.txt is there so the list is
# never empty).
COPY deploy/packages.txt deploy/.prebuilt/bi[n] /tmp/prebuilt/
RUN find /tmp/prebuilt -maxdepth 1 -name 'circuitlab*' -exec mv -t /usr/local/bin {} + && rm -rf /tmp/prebuilt
USER circuitlab

FROM ${BASE_IMAGE} AS build
ARG TORCH_PREFIX
WORKDIR /src
COPY deploy/packages.txt deploy/packages.txt
COPY scripts/packages.sh scripts/packages.sh
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(scripts/packages.sh build) \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCIRCUITLAB_TESTS=OFF -DCIRCUITLAB_BENCH=OFF \
      ${TORCH_PREFIX:+-DCMAKE_PREFIX_PATH=$TORCH_PREFIX} \
 && cmake --build /build \
 && cmake --install /build --prefix /opt/circuitlab

FROM runtime-base AS runtime
COPY --from=build /opt/circuitlab/bin/ /usr/local/bin/
USER circuitlab
