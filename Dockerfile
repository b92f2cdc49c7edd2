# circuitlab: multi-stage image on Debian bookworm, packages from the same
# list the set-up scripts and CI use (deploy/packages.txt).
#
#   docker build --network host -t circuitlab .
#   scripts/dev-certs.sh secrets circuitlab && scripts/add-principal.sh me admin secrets/tokens.txt .
#   docker run --rm -p 50051:50051 -v $PWD/data:/data -v $PWD/secrets:/run/secrets:ro circuitlab
#   circuitlab --ca-cert secrets/ca.pem --token-file me.token whoami
# By default the server listens on 0.0.0.0 with TLS (/run/secrets/server.pem,
# server.key) and principals (/run/secrets/tokens.txt); see deploy/compose.yaml.

FROM debian:bookworm AS build
WORKDIR /src
COPY deploy/packages.txt deploy/packages.txt
COPY scripts/packages.sh scripts/packages.sh
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(scripts/packages.sh build) \
 && rm -rf /var/lib/apt/lists/*
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCIRCUITLAB_TESTS=OFF -DCIRCUITLAB_BENCH=OFF \
 && cmake --build /build \
 && cmake --install /build --prefix /opt/circuitlab

FROM debian:bookworm AS runtime
COPY deploy/packages.txt scripts/packages.sh /tmp/
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      $(PACKAGES_FILE=/tmp/packages.txt /tmp/packages.sh runtime) \
 && rm -rf /var/lib/apt/lists/* /tmp/packages.*
COPY --from=build /opt/circuitlab/bin/ /usr/local/bin/
COPY examples/ /usr/share/circuitlab/examples/
RUN useradd --system --home /data circuitlab && mkdir -p /data && chown circuitlab /data
USER circuitlab
VOLUME /data
EXPOSE 50051
# Health needs no token; the CLI checks the server's certificate (valid for
# 127.0.0.1) against the CA beside it.
HEALTHCHECK --interval=10s --timeout=3s \
  CMD ["circuitlab", "--timeout", "2", "--ca-cert", "/run/secrets/ca.pem", "health"]
ENTRYPOINT ["circuitlab-server"]
CMD ["--data", "/data", "--listen", "0.0.0.0:50051", \
     "--tls-cert", "/run/secrets/server.pem", "--tls-key", "/run/secrets/server.key", \
     "--auth-tokens-file", "/run/secrets/tokens.txt", "--audit-log", "/data/audit.jsonl"]
