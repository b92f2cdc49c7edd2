#!/usr/bin/env bash
# The Kubernetes manifests (deploy/k8s/) validated offline against the API
# schemas (npm kubernetes-models + yaml, installed into a cache directory the
# tier reuses), and a broken copy refused. Installs Debian's nodejs and npm if
# missing.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cache=${CIRCUITLAB_DEPLOY_CACHE:-$HOME/.cache/circuitlab}/k8s-validate
command -v node >/dev/null && command -v npm >/dev/null ||
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nodejs npm >/dev/null
mkdir -p "$cache"
cp "$repo/tests/deploy/k8s_validate.mjs" "$cache/"
if [ ! -d "$cache/node_modules/kubernetes-models" ]; then
  (cd "$cache" && npm init -y >/dev/null && npm install --no-audit --no-fund kubernetes-models@4 yaml@2 >/dev/null)
fi
node "$cache/k8s_validate.mjs" "$repo"/deploy/k8s/*.yaml
# The validator can fail: a probe port as a string and a negative replica count.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed -e 's/grpc: {port: 50052}/grpc: {port: "health"}/' -e 's/replicas: 1/replicas: -1/' \
  "$repo/deploy/k8s/circuitlab.yaml" >"$tmp/broken.yaml"
if node "$cache/k8s_validate.mjs" "$tmp/broken.yaml" 2>"$tmp/err"; then
  echo "k8s_test: FAIL: a broken manifest passed"; exit 1
fi
grep -q "grpc/port must be integer" "$tmp/err" || { cat "$tmp/err"; echo "k8s_test: FAIL: not the expected error"; exit 1; }
echo "k8s_test: PASS"
