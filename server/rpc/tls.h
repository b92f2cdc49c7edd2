// TLS for the gRPC port, with gRPC's own credentials: the server certificate
// and key (--tls-cert, --tls-key) and, for mutual TLS, the CA that client
// certificates must chain to (--tls-client-ca). gRPC's file-watcher provider
// re-reads the three files every `reload_seconds`, so replaced certificates
// take effect for new connections without a restart (existing connections
// keep theirs).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace grpc {
class ServerCredentials;
}

namespace circuitlab::rpc {

struct TlsFiles {
  std::string cert;       // PEM certificate chain (empty = no TLS)
  std::string key;        // PEM private key
  std::string client_ca;  // PEM CA bundle; set = clients must present a certificate it signed
  unsigned reload_seconds = 10;
  bool enabled() const { return !cert.empty() || !key.empty(); }
};

// InvalidArgument naming the flag and file when a file cannot be read, is
// not PEM of the right kind, the key does not match the certificate, or the
// certificate has expired.
absl::Status CheckTlsFiles(const TlsFiles& files);

// Server credentials that watch `files` (CheckTlsFiles them first).
std::shared_ptr<grpc::ServerCredentials> TlsServerCredentials(const TlsFiles& files);

}  // namespace circuitlab::rpc
