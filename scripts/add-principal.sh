#!/usr/bin/env bash
# Adds a principal to a circuitlab tokens file: makes a random token, writes
# it to NAME.token (mode 600; give it to the person, never to the server), and
# appends "NAME ROLE sha256:<digest>" to the tokens file. A running server
# picks the new line up on SIGHUP (kill -HUP <pid>).
#
# Usage: scripts/add-principal.sh NAME ROLE [TOKENS_FILE] [TOKEN_DIR] [OVERRIDE...]
#   ROLE         admin | user | reader | worker (circuitlab-worker only)
#   TOKENS_FILE  default ./tokens.txt          TOKEN_DIR  default .
#   OVERRIDE     max_queued=N max_analyses=N max_watches=N max_sweep_runs=N
# Example: scripts/add-principal.sh alice user tokens.txt ~/.circuitlab max_queued=500
set -euo pipefail
if [[ $# -lt 2 ]]; then sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2; fi
name=$1 role=$2 file=${3:-tokens.txt} dir=${4:-.}
shift $(( $# < 4 ? $# : 4 ))
[[ $name =~ ^[A-Za-z0-9._@-]{1,64}$ ]] || { echo "add-principal.sh: bad name '$name' (1-64 of A-Z a-z 0-9 . _ - @)" >&2; exit 2; }
[[ $role == admin || $role == user || $role == reader || $role == worker ]] || { echo "add-principal.sh: role must be admin, user, reader or worker" >&2; exit 2; }
if [[ -f $file ]] && awk -v n="$name" '$1 == n { found = 1 } END { exit !found }' "$file"; then
  echo "add-principal.sh: $file already names '$name'" >&2; exit 1
fi
mkdir -p "$dir"
token=$(openssl rand -hex 32)
(umask 077; printf '%s\n' "$token" > "$dir/$name.token")
digest=$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)
printf '%s %s sha256:%s%s\n' "$name" "$role" "$digest" "${*:+ $*}" >> "$file"
echo "$name ($role): token in $dir/$name.token; line added to $file (kill -HUP the server to apply)"
