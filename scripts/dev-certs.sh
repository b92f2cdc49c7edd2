#!/usr/bin/env bash
# Makes a throwaway certificate authority, a server certificate signed by it
# and a client certificate (for mutual TLS), with Debian's openssl. For tests,
# docker compose and the demo; a real deployment uses its own CA.
#
# Usage: scripts/dev-certs.sh [DIR] [NAME...]
#   DIR   where to write (default ./certs): ca.pem ca.key server.pem server.key
#         client.pem client.key
#   NAME  extra host names or IP addresses the server certificate is valid
#         for, beside localhost, 127.0.0.1 and ::1 (e.g. the container name)
# Valid for 30 days (CIRCUITLAB_CERT_DAYS). Keys are EC P-256, mode 600.
set -euo pipefail
dir=${1:-certs}
shift || true
days=${CIRCUITLAB_CERT_DAYS:-30}
command -v openssl >/dev/null || { echo "dev-certs.sh: openssl is missing (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
umask 077

san="DNS:localhost,IP:127.0.0.1,IP:::1"
for name in "$@"; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then san+=",IP:$name"; else san+=",DNS:$name"; fi
done

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

key ca.key
openssl req -x509 -new -key ca.key -days "$days" -subj "/CN=circuitlab test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.pem

sign() {  # name subject extensions
  key "$1.key"
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" -out "$1.pem" \
    -extfile <(printf '%s\n' "$3") 2>/dev/null
  rm -f "$1.csr"
}
sign server "/CN=circuitlab-server" "subjectAltName=$san
extendedKeyUsage=serverAuth
basicConstraints=CA:FALSE"
sign client "/CN=circuitlab-client" "extendedKeyUsage=clientAuth
basicConstraints=CA:FALSE"
rm -f ca.srl
chmod 644 ca.pem server.pem client.pem
echo "wrote $(pwd)/{ca,server,client}.{pem,key} (server valid for $san, $days days)"
