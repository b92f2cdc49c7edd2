// The HTTP port's connections seen from outside cpp-httplib (issue 51
// item 6). httplib gives a connection to a pooled thread as soon as it is
// accepted, and only calls this server's code once the request's headers
// have been read: a client that sends a header line every second, under the
// per-read timeout, holds a thread for as long as it likes, and counts
// toward no per-address limit. Debian's httplib (0.11 on Debian 12, newer on
// 13) has no hook at accept time, so a watchdog thread looks at the
// process's sockets on the port (/proc/self/fd, getsockname, getpeername)
// every `period` and:
//
//   - closes a connection that has spent longer than `request_deadline` in
//     one request (from its accept, or from its previous answer on a
//     kept-alive connection, until the handler starts), answering 408;
//   - closes the newest connections of an address that has more than
//     `max_per_peer` (connections still in their headers count, and those
//     waiting for a thread), answering 429;
//
// never a connection whose request is in a handler (EnterHandler ..
// LeaveHandler: an event stream is long by design). Closing is shutdown(2)
// of the server's socket after checking it is still the same connection (its
// address and port on both ends), so httplib's read fails and it closes its
// side as for any client that went away.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace circuitlab::http {

class ConnectionGuard {
 public:
  struct Options {
    int port = 0;  // the HTTP port (the server's side of each connection)
    int max_per_peer = 32;
    std::chrono::milliseconds request_deadline{10000};
    std::chrono::milliseconds period{250};
    bool tls = false;  // no plaintext answer is written before closing
  };
  // `closed(reason)` is called for each connection closed ("request_deadline"
  // or "peer_limit"), outside the guard's lock.
  ConnectionGuard(Options options, std::function<void(const char*)> closed);
  ~ConnectionGuard();  // Stop()
  ConnectionGuard(const ConnectionGuard&) = delete;
  ConnectionGuard& operator=(const ConnectionGuard&) = delete;

  // Starts / stops the watchdog thread (EnterHandler and LeaveHandler may
  // still be called after Stop).
  void Start();
  void Stop();
  // The request of the connection from `ip`:`port` is in a handler from now
  // on / is done (the next request's time starts).
  void EnterHandler(const std::string& ip, int port);
  void LeaveHandler(const std::string& ip, int port);
  // One look at the sockets now; how many connections it closed.
  int Sweep();

 private:
  struct Connection {
    int fd = -1;
    std::string ip;
    int port = 0;
    std::chrono::steady_clock::time_point since;  // accepted, or the previous answer sent
    bool in_handler = false;
    bool seen = false;  // in this sweep
  };
  void Loop();
  static std::string Key(const std::string& ip, int port) { return ip + "|" + std::to_string(port); }
  // Answers `status` (unless TLS) and shuts the socket down, if `fd` is still
  // the connection `c`.
  bool Close(const Connection& c, const char* answer);

  const Options options_;
  const std::function<void(const char*)> closed_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, Connection> connections_;  // by Key(peer ip, peer port)
  std::thread thread_;
};

}  // namespace circuitlab::http
