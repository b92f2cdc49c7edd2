#!/usr/bin/env bash
# The `deploy` tier: the image built and run with a real Docker engine, driven
# from the host's CLI as a user would (issue 16).
#
#   tests/deploy/deploy_test.sh      (BUILD_DIR: the host build, default build/)
#   DEPLOY_TARGET=runtime tests/deploy/deploy_test.sh
#                                    (label deploy-full: the Dockerfile's default
#                                    target, a full source build in Docker, ~30 min
#                                    on 2 cores; the same checks on its image)
#
# 1. A Docker engine (deploy/docker-env.sh: installs docker.io/debootstrap if
#    missing, starts dockerd by pid, makes debian:bookworm locally, cached).
# 2. The image's `prebuilt` target: the host's binaries in the runtime stage
#    (or DEPLOY_TARGET's).
# 3. A container with a data volume, TLS and a tokens file, non-root, a
#    read-only root filesystem: healthy; examples/induction.json trains to the
#    README's numbers; a longer run is interrupted by `docker stop` (exit 0),
#    resumes in a *new* container on the same volume, and ends with exactly the
#    metrics of an uninterrupted run of the same spec.
# Everything it starts it stops (containers, volume, the engine if it started
# it). Prints the image's size and build time.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
build=${BUILD_DIR:-$repo/build}
cli_bin=$build/client/circuitlab
target=${DEPLOY_TARGET:-prebuilt}
case $target in prebuilt | runtime) ;; *) echo "DEPLOY_TARGET must be prebuilt or runtime, not '$target'" >&2; exit 2 ;; esac
image=circuitlab:deploy-$target
tag=cldeploy$$
tmp=$(mktemp -d)
engine_started=0

say() { echo "deploy_test: $*"; }
fail() { say "FAIL: $*"; exit 1; }
cleanup() {
  set +e
  for c in $(docker ps -aq --filter "name=$tag" 2>/dev/null); do docker rm -f "$c" >/dev/null; done
  docker volume rm "$tag-data" "$tag-wdata" "${tag}_circuitlab-data" >/dev/null 2>&1
  [ "$engine_started" = 1 ] && deploy/docker-env.sh stop
  rm -rf "$tmp" "$repo/deploy/.prebuilt"
}
trap cleanup EXIT

# 1. The engine.
export DOCKER_HOST=unix://${CIRCUITLAB_DOCKER_DIR:-/tmp/circuitlab-docker}/docker.sock
docker version >/dev/null 2>&1 || engine_started=1
eval "$(deploy/docker-env.sh start)"

# 2. The image.
rm -rf deploy/.prebuilt
[ "$target" = prebuilt ] && cmake --install "$build" --prefix deploy/.prebuilt >/dev/null
t0=$(date +%s)
docker build --network host --target "$target" -t "$image" . >"$tmp/build.log" 2>&1 ||
  { tail -30 "$tmp/build.log"; fail "docker build"; }
size=$(docker image inspect -f '{{.Size}}' "$image")
say "image $image built in $(( $(date +%s) - t0 )) s, $(( size / 1000000 )) MB"

# 3. Secrets, readable by the image's user (uid 999).
scripts/dev-certs.sh "$tmp/secrets" >/dev/null
scripts/add-principal.sh tester user "$tmp/secrets/tokens.txt" "$tmp" >/dev/null
chmod a+r "$tmp/secrets"/*
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cli=("$cli_bin" --server "127.0.0.1:$port" --ca-cert "$tmp/secrets/ca.pem" --token-file "$tmp/tester.token")
docker volume create "$tag-data" >/dev/null

hport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start_container() {  # name
  docker run -d --name "$1" --network host --read-only --tmpfs /tmp \
    -v "$tag-data:/data" -v "$tmp/secrets:/run/secrets:ro" -e "CIRCUITLAB_TARGET=127.0.0.1:$port" "$image" \
    --data /data --listen "127.0.0.1:$port" --tls-cert /run/secrets/server.pem --tls-key /run/secrets/server.key \
    --auth-tokens-file /run/secrets/tokens.txt --audit-log /data/audit.jsonl --http "127.0.0.1:$hport" >/dev/null
  for _ in $(seq 120); do
    [ "$(docker inspect -f '{{.State.Health.Status}}' "$1")" = healthy ] && return 0
    [ "$(docker inspect -f '{{.State.Running}}' "$1")" = true ] || break
    sleep 0.5
  done
  docker logs "$1" 2>&1 | tail -20
  fail "container $1 did not become healthy"
}

start_container "$tag-a"
[ "$(docker exec "$tag-a" id -u)" = 999 ] || fail "the server runs as root"
docker exec "$tag-a" touch /usr/local/bin/x 2>/dev/null && fail "the root filesystem is writable"
# The health check can pass a moment before the start-up line is logged.
for _ in $(seq 50); do
  docker logs "$tag-a" 2>&1 | grep "circuitlab-server listening on 127.0.0.1:$port (port $port, TLS)" >/dev/null && break
  sleep 0.2
done
docker logs "$tag-a" 2>&1 | grep "circuitlab-server listening on 127.0.0.1:$port (port $port, TLS)" >/dev/null ||
  { docker logs "$tag-a" 2>&1 | tail -5; fail "no start-up line in docker logs"; }
"${cli[@]}" whoami | grep "transport  TLS" >/dev/null || fail "whoami over TLS"
# The HTTP port: HTTPS with the same certificate, tokens as on gRPC.
https=(curl -s --cacert "$tmp/secrets/ca.pem" -o /dev/null -w '%{http_code}')
[ "$("${https[@]}" "https://127.0.0.1:$hport/readyz")" = 200 ] || fail "https /readyz"
[ "$("${https[@]}" "https://127.0.0.1:$hport/api/v1/runs")" = 401 ] || fail "the JSON API answered without a token"
[ "$("${https[@]}" -H "Authorization: Bearer $(cat "$tmp/tester.token")" "https://127.0.0.1:$hport/metrics")" = 200 ] ||
  fail "https /metrics with a token"
curl -s -o /dev/null "http://127.0.0.1:$hport/readyz" && fail "plaintext HTTP reached the HTTPS port"
say "dashboard port: HTTPS, tokens required"
"$cli_bin" --server "127.0.0.1:$port" health >/dev/null 2>&1 && fail "plaintext reached the TLS port"

# The README's demo numbers, trained in the container.
out=$("${cli[@]}" submit examples/induction.json --watch)
grep -q "^r1 SUCCEEDED" <<<"$out" || { echo "$out"; fail "induction run"; }
grep -q "eval/icl_rare/accuracy           0.9854" <<<"$out" || { echo "$out"; fail "not the README's icl_rare"; }
grep -q "eval/iwl/accuracy                1.0000" <<<"$out" || { echo "$out"; fail "not the README's iwl"; }
say "induction demo: SUCCEEDED with the README's numbers"

# A longer run, stopped mid-way by `docker stop`, resumed by a new container.
# Long enough that the stop lands well before its end on a fast machine (the
# demo model trains at ~500 steps/s: 1500 steps once ended inside the stop).
long_steps=6000
sed -e "s/\"steps\": 600/\"steps\": $long_steps/" -e 's/"checkpoint_every": 200/"checkpoint_every": 100/' \
  -e 's/induction-demo/resume/' examples/induction.json >"$tmp/long.json"
"${cli[@]}" submit "$tmp/long.json" >/dev/null
step() { "${cli[@]}" --json show "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["progress"].get("step", 0))'; }
for _ in $(seq 600); do [ "$(step r2)" -ge 400 ] && break; sleep 0.1; done
at=$(step r2)
t0=$(date +%s%N)
docker stop -t 60 "$tag-a" >/dev/null
say "docker stop at step $at: $(( ($(date +%s%N) - t0) / 1000000 )) ms, exit code $(docker inspect -f '{{.State.ExitCode}}' "$tag-a")"
[ "$(docker inspect -f '{{.State.ExitCode}}' "$tag-a")" = 0 ] || { docker logs "$tag-a" | tail; fail "SIGTERM exit code"; }
[ "$at" -lt "$long_steps" ] || fail "the run ended before the stop"
docker rm "$tag-a" >/dev/null

start_container "$tag-b"
"${cli[@]}" watch r2 >/dev/null || fail "the resumed run did not succeed"
"${cli[@]}" submit "$tmp/long.json" --watch >/dev/null || fail "the uninterrupted run"
"${cli[@]}" show r2 | grep "attempts 2" >/dev/null || fail "the resumed run should show attempts 2"
for r in r2 r3; do
  "${cli[@]}" metrics "$r" --csv | sed "s/^$r,//" >"$tmp/$r.csv"
done
[ "$(wc -l <"$tmp/r2.csv")" -gt 100 ] || fail "too few metric rows"
cmp -s "$tmp/r2.csv" "$tmp/r3.csv" || { diff "$tmp/r2.csv" "$tmp/r3.csv" | head; fail "resumed != uninterrupted"; }
say "resumed in a new container: $(wc -l <"$tmp/r2.csv") metric rows identical to the uninterrupted run"
"${cli[@]}" ls | grep "r1 " >/dev/null || fail "r1 lost across containers"
docker exec "$tag-b" sh -c 'test -s /data/audit.jsonl' || fail "no audit log on the volume"
docker stop -t 60 "$tag-b" >/dev/null

# 4. Compose: deploy/compose.yaml as shipped, but for its `ports:` (this test
# engine has no bridge network: tests/deploy/compose.host.yaml puts the service
# on the host's network instead, and compose 1.29 cannot drop a list in an
# override); secrets from deploy/make-secrets.sh; up, a run, down, up again:
# the run is still there.
command -v docker-compose >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker-compose >/dev/null
mkdir "$tmp/compose"
grep -v '^    ports:' deploy/compose.yaml >"$tmp/compose/compose.yaml"
cp tests/deploy/compose.host.yaml "$tmp/compose/"
deploy/make-secrets.sh "$tmp/compose/secrets" >/dev/null
export CIRCUITLAB_IMAGE=$image CIRCUITLAB_PORT=$port CIRCUITLAB_HTTP_PORT=$hport
dc=(docker-compose -p "$tag" -f "$tmp/compose/compose.yaml" -f "$tmp/compose/compose.host.yaml")
ccli=("$cli_bin" --server "127.0.0.1:$port" --ca-cert "$tmp/compose/secrets/ca.pem" --token-file "$tmp/compose/admin.token")
healthy() {  # container
  for _ in $(seq 120); do
    [ "$(docker inspect -f '{{.State.Health.Status}}' "$1" 2>/dev/null)" = healthy ] && return 0
    sleep 0.5
  done
  docker logs "$1" 2>&1 | tail -20
  fail "$1 did not become healthy"
}
"${dc[@]}" up -d --no-build >/dev/null 2>&1 || { "${dc[@]}" up -d --no-build; fail "compose up"; }
healthy "${tag}_circuitlab_1"
"${ccli[@]}" whoami | grep "principal  admin" >/dev/null || fail "compose: whoami"
"${ccli[@]}" submit examples/induction.json --watch | grep "^r1 SUCCEEDED" >/dev/null || fail "compose: the induction run"
"${dc[@]}" down >/dev/null 2>&1
"${dc[@]}" up -d --no-build >/dev/null 2>&1
healthy "${tag}_circuitlab_1"
"${ccli[@]}" ls | grep "^r1 .*SUCCEEDED" >/dev/null || fail "compose: r1 lost across down/up"
"${dc[@]}" down -v >/dev/null 2>&1
say "compose: up, a run, down, up again: the run is still listed"

# 5. The worker in the image (what deploy/k8s/worker-job.yaml runs): a server
# on --executor workers, a worker container with the Job's command, read-only
# and non-root; the README's demo trains on the worker with the same numbers;
# `docker stop` of the worker exits 0.
scripts/add-principal.sh pilot worker "$tmp/secrets/tokens.txt" "$tmp" >/dev/null
chmod a+r "$tmp/secrets"/*
mkdir "$tmp/worker" && cp "$tmp/pilot.token" "$tmp/worker/token" && cp "$tmp/secrets/ca.pem" "$tmp/worker/"
chmod a+rx "$tmp/worker" && chmod a+r "$tmp/worker"/*
docker volume create "$tag-wdata" >/dev/null
docker run -d --name "$tag-ws" --network host --read-only --tmpfs /tmp -v "$tag-wdata:/data" \
  -v "$tmp/secrets:/run/secrets:ro" -e "CIRCUITLAB_TARGET=127.0.0.1:$port" "$image" \
  --data /data --listen "127.0.0.1:$port" --tls-cert /run/secrets/server.pem --tls-key /run/secrets/server.key \
  --auth-tokens-file /run/secrets/tokens.txt --executor workers --http "" >/dev/null
healthy "$tag-ws"
docker run -d --name "$tag-ww" --network host --read-only --tmpfs /tmp -v "$tmp/worker:/run/secrets/worker:ro" \
  --entrypoint circuitlab-worker "$image" --server "127.0.0.1:$port" --ca-cert /run/secrets/worker/ca.pem \
  --token-file /run/secrets/worker/token --idle-exit 300 --engine-job k8s:deploy-test >/dev/null
out=$("${cli[@]}" submit examples/induction.json --watch)
grep -q "eval/icl_rare/accuracy           0.9854" <<<"$out" || { echo "$out"; docker logs "$tag-ww" | tail; fail "worker: not the README's icl_rare"; }
"${cli[@]}" show r1 | grep "k8s:deploy-test" >/dev/null || fail "r1 did not train on the worker container"
docker stop -t 60 "$tag-ww" >/dev/null
[ "$(docker inspect -f '{{.State.ExitCode}}' "$tag-ww")" = 0 ] || { docker logs "$tag-ww" | tail; fail "worker exit code"; }
docker stop -t 60 "$tag-ws" >/dev/null
say "worker container: the demo trained on it with the README's numbers; docker stop: exit 0"
say "PASS"
