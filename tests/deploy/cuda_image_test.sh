#!/usr/bin/env bash
# The CUDA image (issue 35; label deploy): the Dockerfile built with
# --build-arg BASE=trixie --build-arg TORCH=cuda on the `prebuilt` target,
# packing the binaries the cuda-build tier linked against Debian 13's CUDA
# LibTorch (tests/debian13/cuda_build_test.sh leaves them in its root), with
# deploy/cuda-placeholders.sh's stand-ins for cuDNN and the driver, since this
# machine has no GPU and no route to NVIDIA. Then, as a user would without
# `--gpus`: the container (TLS, tokens, read-only, uid 999) becomes healthy,
# reports LibTorch 2.6.0 (CUDA 12.4) with 0 CUDA devices, trains the README's
# demo on its CPU slot, and stops with exit code 0. Prints the image's size
# and build time. What a GPU host does instead: docs/howto/debian-and-gpus.md.
#   tests/deploy/cuda_image_test.sh      (BUILD_DIR: the host build, for the CLI)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
build=${BUILD_DIR:-$repo/build}
cache=${CIRCUITLAB_DEPLOY_CACHE:-$HOME/.cache/circuitlab}
install=$cache/roots/trixie-cuda/build/install
image=circuitlab:deploy-cuda
tag=clcuda$$
tmp=$(mktemp -d)
engine_started=0

say() { echo "cuda_image_test: $*"; }
fail() { say "FAIL: $*"; exit 1; }
cleanup() {
  set +e
  docker rm -f "$tag" >/dev/null 2>&1
  docker volume rm "$tag-data" >/dev/null 2>&1
  [ "$engine_started" = 1 ] && deploy/docker-env.sh stop
  rm -rf "$tmp" "$repo/deploy/.prebuilt-cuda" "$repo/deploy/.cuda-debs"
}
trap cleanup EXIT

[ -x "$install/bin/circuitlab-server" ] ||
  fail "no CUDA build in $install: run the cuda-build tier first (ctest -L cuda-build)"
ls "$cache"/cuda-debs/*.deb >/dev/null 2>&1 || fail "no stand-in packages in $cache/cuda-debs (the cuda-build tier makes them)"

export DOCKER_HOST=unix://${CIRCUITLAB_DOCKER_DIR:-/tmp/circuitlab-docker}/docker.sock
docker version >/dev/null 2>&1 || engine_started=1
eval "$(deploy/docker-env.sh start trixie)"

rm -rf deploy/.prebuilt-cuda deploy/.cuda-debs
cp -r "$install" deploy/.prebuilt-cuda
mkdir deploy/.cuda-debs && cp "$cache"/cuda-debs/*.deb deploy/.cuda-debs/
t0=$(date +%s)
docker build --network host --build-arg BASE=trixie --build-arg TORCH=cuda --build-arg PREBUILT=deploy/.prebuilt-cuda \
  --target prebuilt -t "$image" . >"$tmp/build.log" 2>&1 || { tail -30 "$tmp/build.log"; fail "docker build"; }
size=$(docker image inspect -f '{{.Size}}' "$image")
say "image $image built in $(( $(date +%s) - t0 )) s, $(( size / 1000000 )) MB"

scripts/dev-certs.sh "$tmp/secrets" >/dev/null
scripts/add-principal.sh tester user "$tmp/secrets/tokens.txt" "$tmp" >/dev/null
chmod a+r "$tmp/secrets"/*
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cli=("$build/client/circuitlab" --server "127.0.0.1:$port" --ca-cert "$tmp/secrets/ca.pem" --token-file "$tmp/tester.token")
docker volume create "$tag-data" >/dev/null
docker run -d --name "$tag" --network host --read-only --tmpfs /tmp -v "$tag-data:/data" \
  -v "$tmp/secrets:/run/secrets:ro" -e "CIRCUITLAB_TARGET=127.0.0.1:$port" "$image" \
  --data /data --listen "127.0.0.1:$port" --tls-cert /run/secrets/server.pem --tls-key /run/secrets/server.key \
  --auth-tokens-file /run/secrets/tokens.txt --http "" >/dev/null
for _ in $(seq 120); do
  [ "$(docker inspect -f '{{.State.Health.Status}}' "$tag")" = healthy ] && break
  [ "$(docker inspect -f '{{.State.Running}}' "$tag")" = true ] || break
  sleep 0.5
done
[ "$(docker inspect -f '{{.State.Health.Status}}' "$tag")" = healthy ] ||
  { docker logs "$tag" 2>&1 | tail -20; fail "the CUDA container did not become healthy"; }
[ "$(docker exec "$tag" id -u)" = 999 ] || fail "the server runs as root"

health=$("${cli[@]}" health)
grep -q "LibTorch 2.6.0 (CUDA 12.4), 0 CUDA devices, slots cpu:0" <<<"$health" || { echo "$health"; fail "health"; }
docker logs "$tag" 2>&1 | grep "0 CUDA devices: no CUDA device or driver found, runs train on the CPU slots" >/dev/null ||
  { docker logs "$tag" 2>&1 | tail; fail "no start-up line about the missing GPU"; }
say "health: $(tail -1 <<<"$health")"
out=$("${cli[@]}" submit examples/induction.json --watch)
grep -q "^r1 SUCCEEDED" <<<"$out" || { echo "$out"; fail "the demo in the CUDA image"; }
say "demo: $(grep -E 'eval/icl_rare/accuracy|eval/iwl/accuracy' <<<"$out" | tr -s ' ' | paste -sd ';')"
docker stop -t 60 "$tag" >/dev/null
[ "$(docker inspect -f '{{.State.ExitCode}}' "$tag")" = 0 ] || { docker logs "$tag" | tail; fail "SIGTERM exit code"; }
say "PASS"
