#!/usr/bin/env bash
# Makes what deploy/compose.yaml mounts at /run/secrets: a throwaway CA and
# server certificate (scripts/dev-certs.sh) and a tokens file with an admin
# principal and a worker principal (for circuitlab-worker: Kubernetes' worker
# Job, Slurm pilots) whose tokens are written beside DIR, all readable by the
# image's user.
#
#   deploy/make-secrets.sh [DIR] [HOST...]   # DIR default deploy/secrets; HOST: names the certificate is for
#
# Prints where the admin token is. A real deployment brings its own CA's
# certificate and adds principals with scripts/add-principal.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-$here/deploy/secrets}
shift || true
"$here/scripts/dev-certs.sh" "$dir" "$@" >/dev/null
rm -f "$dir/tokens.txt"
"$here/scripts/add-principal.sh" admin admin "$dir/tokens.txt" "$dir" >/dev/null
"$here/scripts/add-principal.sh" worker worker "$dir/tokens.txt" "$dir" >/dev/null
# The server runs as uid 999 in the image and reads these through a
# read-only bind mount; the client key and CA key are not needed there.
rm -f "$dir/ca.key" "$dir/client.pem" "$dir/client.key"
mv "$dir/admin.token" "$dir/../admin.token.tmp" && mv "$dir/worker.token" "$dir/../worker.token.tmp"
chmod a+r "$dir"/*
mv "$dir/../admin.token.tmp" "$(dirname "$dir")/admin.token"
mv "$dir/../worker.token.tmp" "$(dirname "$dir")/worker.token"
echo "secrets in $dir; the admin token in $(dirname "$dir")/admin.token, the workers' in $(dirname "$dir")/worker.token"
