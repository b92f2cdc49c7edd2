// The TLS files both fronts serve with: the server certificate and key
// (--tls-cert, --tls-key) and, for mutual TLS, the CA that client
// certificates must chain to (--tls-client-ca), checked once at start with
// OpenSSL so a bad file is named before anything listens. The gRPC port
// watches them (rpc/server.cc: replaced certificates apply to new
// connections without a restart); the HTTP port loads them at start.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace circuitlab::security {

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

}  // namespace circuitlab::security
