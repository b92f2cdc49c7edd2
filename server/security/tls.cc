#include "server/security/tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <memory>

#include "absl/status/statusor.h"

namespace circuitlab::security {
namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using X509Ptr = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using KeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;

absl::Status Bad(const std::string& flag, const std::string& path, const std::string& what) {
  ERR_clear_error();
  return absl::InvalidArgumentError(flag + " " + path + ": " + what);
}

absl::StatusOr<X509Ptr> ReadCertificate(const std::string& flag, const std::string& path) {
  Bio bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) return Bad(flag, path, "cannot be read");
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) return Bad(flag, path, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)");
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return Bad(flag, path, "the certificate has expired (make a new one: scripts/dev-certs.sh for tests)");
  }
  return cert;
}

}  // namespace

absl::Status CheckTlsFiles(const TlsFiles& files) {
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError("TLS needs both --tls-cert and --tls-key");
  }
  absl::StatusOr<X509Ptr> cert = ReadCertificate("--tls-cert", files.cert);
  if (!cert.ok()) return cert.status();
  Bio bio(BIO_new_file(files.key.c_str(), "r"));
  if (!bio) return Bad("--tls-key", files.key, "cannot be read");
  KeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) return Bad("--tls-key", files.key, "holds no unencrypted PEM private key");
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    return Bad("--tls-key", files.key, "does not match the certificate in " + files.cert);
  }
  if (!files.client_ca.empty()) {
    absl::StatusOr<X509Ptr> ca = ReadCertificate("--tls-client-ca", files.client_ca);
    if (!ca.ok()) return ca.status();
  }
  if (files.reload_seconds < 1 || files.reload_seconds > 86400) {
    return absl::InvalidArgumentError("--tls-reload-seconds must be in [1, 86400], got " +
                                      std::to_string(files.reload_seconds));
  }
  return absl::OkStatus();
}

}  // namespace circuitlab::security
