// How a client reaches a circuitlab server: address, deadline, token, TLS
// material. The client library (client.h) and circuitlab-worker's channel
// home (channel.h) both take it.
#pragma once

#include <chrono>
#include <string>

namespace circuitlab::client {

struct ClientOptions {
  std::string server = "127.0.0.1:50051";
  std::chrono::milliseconds timeout{30000};  // deadline of unary calls
  std::string token;                          // bearer token, if the server wants one
  std::string client_name;                    // sent as x-circuitlab-client (default user@host)
  // TLS: on when `tls` or any PEM below is set. Empty root PEM = the system's
  // CAs. A client certificate and key for servers that require mutual TLS.
  bool tls = false;
  std::string ca_cert_pem;
  std::string client_cert_pem;
  std::string client_key_pem;
  std::string tls_server_name;  // check the server's certificate for this name instead
  // Wait (within the deadline) for the connection instead of failing at
  // once with UNAVAILABLE when the server cannot be reached yet: for tests
  // and scripts that start a server and talk to it at once.
  bool wait_for_ready = false;
};

}  // namespace circuitlab::client
