# circuitlab: multi-stage image on Debian bookworm, packages from the same
# list the set-up scripts and CI use (deploy/packages.txt).
#
#   docker build --network host -t circuitlab .
#   docker run --rm --network host -v $PWD/data:/data circuitlab \
#       --data /data --listen 127.0.0.1:50051
# Listening beyond loopback needs a token file (see deploy/compose.yaml).

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
HEALTHCHECK --interval=10s --timeout=3s CMD ["circuitlab", "--timeout", "2", "health"]
ENTRYPOINT ["circuitlab-server"]
CMD ["--data", "/data", "--listen", "0.0.0.0:50051", "--auth-token-file", "/run/secrets/circuitlab_token"]
