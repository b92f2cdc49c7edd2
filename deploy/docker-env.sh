#!/usr/bin/env bash
# A Docker engine for the deploy tier and for trying the image on a machine
# without one running (no systemd on these machines). Idempotent.
#
#   deploy/docker-env.sh start [SUITE...]  # prints `export DOCKER_HOST=...`; eval it
#   deploy/docker-env.sh stop              # stops the engine this script started (by pid)
#
# start: installs Debian's docker.io and debootstrap if missing, starts dockerd
# on a private socket (state under $CIRCUITLAB_DOCKER_DIR, default
# /tmp/circuitlab-docker) unless one already answers there, and makes the base
# images debian:SUITE (default bookworm; trixie for the Debian 13 and CUDA
# images) locally, since no registry is reachable: deploy/minbase.sh's
# debootstrap tarballs, cached under $CIRCUITLAB_DEPLOY_CACHE.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${CIRCUITLAB_DOCKER_DIR:-/tmp/circuitlab-docker}
sock=unix://$dir/docker.sock
export DOCKER_HOST=$sock

log() { echo "docker-env: $*" >&2; }

start() {
  if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
    log "installing docker.io and debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker.io debootstrap >&2
  fi
  mkdir -p "$dir/data" "$dir/exec"
  if ! docker version >/dev/null 2>&1; then
    log "starting dockerd ($dir)"
    dockerd --storage-driver overlay2 --iptables=false --bridge=none --data-root "$dir/data" \
      --exec-root "$dir/exec" -H "$sock" --pidfile "$dir/dockerd.pid" >"$dir/dockerd.log" 2>&1 &
    for _ in $(seq 100); do docker version >/dev/null 2>&1 && break; sleep 0.2; done
    docker version >/dev/null || { log "dockerd did not start; see $dir/dockerd.log"; exit 1; }
  fi
  local suite
  for suite in "${@:-bookworm}"; do
    docker image inspect "debian:$suite" >/dev/null 2>&1 && continue
    docker import "$("$here/minbase.sh" "$suite")" "debian:$suite" >/dev/null
  done
  echo "export DOCKER_HOST=$sock"
}

stop() {
  if [ -f "$dir/dockerd.pid" ]; then
    local pid
    pid=$(cat "$dir/dockerd.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/dockerd.pid"
  fi
  # A killed engine can leave its network namespace mounted.
  umount "$dir/exec/netns/default" 2>/dev/null || true
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
