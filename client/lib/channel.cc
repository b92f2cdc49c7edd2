#include "client/lib/channel.h"

namespace circuitlab::client {

std::shared_ptr<grpc::Channel> MakeChannel(const ClientOptions& options, grpc::ChannelArguments args) {
  args.SetMaxReceiveMessageSize(64 << 20);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls || !options.ca_cert_pem.empty() || !options.client_cert_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.ca_cert_pem;
    ssl.pem_cert_chain = options.client_cert_pem;
    ssl.pem_private_key = options.client_key_pem;
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(options.server, credentials, args);
}

}  // namespace circuitlab::client
