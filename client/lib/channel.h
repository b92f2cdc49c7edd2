// The one place a gRPC channel to a circuitlab server is made from
// ClientOptions (address, TLS material): the client library and
// circuitlab-worker share it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>

#include "client/lib/options.h"

namespace circuitlab::client {

// Plaintext, or TLS when `options.tls` or any PEM is set (an empty root PEM
// means the system's CAs); `args` may carry the caller's own settings.
std::shared_ptr<grpc::Channel> MakeChannel(const ClientOptions& options, grpc::ChannelArguments args = {});

}  // namespace circuitlab::client
