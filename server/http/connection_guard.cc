#include "server/http/connection_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>
#include <utility>
#include <vector>

namespace circuitlab::http {
namespace {

// A connected socket's address on one end, as httplib names a peer.
bool AddressOf(const sockaddr_storage& a, std::string* ip, int* port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    if (inet_ntop(AF_INET, &v4->sin_addr, text, sizeof text) == nullptr) return false;
    *port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    if (inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text) == nullptr) return false;
    *port = ntohs(v6->sin6_port);
  } else {
    return false;
  }
  *ip = text;
  return true;
}

// For `fd`: true with the peer's address when it is a connection accepted on
// local port `port`.
bool PeerOn(int fd, int port, std::string* ip, int* peer_port) {
  sockaddr_storage local{}, peer{};
  socklen_t n = sizeof local;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &n) != 0) return false;  // not a socket
  std::string local_ip;
  int local_port = 0;
  if (!AddressOf(local, &local_ip, &local_port) || local_port != port) return false;
  n = sizeof peer;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &n) != 0) return false;  // the listening socket
  return AddressOf(peer, ip, peer_port);
}

std::string Answer(int status, const char* reason, const std::string& code, const std::string& message) {
  const std::string body = "{\"code\":\"" + code + "\",\"message\":\"" + message + "\"}\n";
  return "HTTP/1.1 " + std::to_string(status) + " " + reason +
         "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

}  // namespace

ConnectionGuard::ConnectionGuard(Options options, std::function<void(const char*)> closed)
    : options_(options), closed_(std::move(closed)) {}

ConnectionGuard::~ConnectionGuard() { Stop(); }

void ConnectionGuard::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ConnectionGuard::Start() { thread_ = std::thread([this] { Loop(); }); }

void ConnectionGuard::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, options_.period, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    Sweep();
    lock.lock();
  }
}

void ConnectionGuard::EnterHandler(const std::string& ip, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  Connection& c = connections_[Key(ip, port)];
  c.ip = ip;
  c.port = port;
  c.in_handler = true;
}

void ConnectionGuard::LeaveHandler(const std::string& ip, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = connections_.find(Key(ip, port));
  if (it == connections_.end()) return;
  it->second.in_handler = false;
  it->second.since = std::chrono::steady_clock::now();
}

bool ConnectionGuard::Close(const Connection& c, const char* answer) {
  std::string ip;
  int port = 0;
  if (c.fd < 0 || !PeerOn(c.fd, options_.port, &ip, &port) || ip != c.ip || port != c.port) return false;
  if (!options_.tls && answer != nullptr) {
    const std::string text = answer;
    (void)::send(c.fd, text.data(), text.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  return ::shutdown(c.fd, SHUT_RDWR) == 0;
}

int ConnectionGuard::Sweep() {
  struct Seen {
    int fd;
    std::string ip;
    int port;
  };
  std::vector<Seen> seen;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    const int own = ::dirfd(d);
    while (dirent* e = ::readdir(d)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || fd == own) continue;
      Seen s{static_cast<int>(fd), "", 0};
      if (PeerOn(s.fd, options_.port, &s.ip, &s.port)) seen.push_back(std::move(s));
    }
    ::closedir(d);
  }
  const auto now = std::chrono::steady_clock::now();
  static const std::string late =
      Answer(408, "Request Timeout", "DEADLINE_EXCEEDED", "the request did not arrive whole in time; closed");
  const std::string crowded =
      Answer(429, "Too Many Requests", "RESOURCE_EXHAUSTED",
             "too many connections from one address (--http-max-per-peer=" + std::to_string(options_.max_per_peer) +
                 "); closed");
  std::vector<const char*> reasons;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, c] : connections_) c.seen = false;
    for (Seen& s : seen) {
      auto [it, fresh] = connections_.try_emplace(Key(s.ip, s.port));
      Connection& c = it->second;
      if (fresh || c.fd < 0) {
        c.ip = s.ip;
        c.port = s.port;
        if (fresh) c.since = now;
      }
      c.fd = s.fd;
      c.seen = true;
    }
    // Gone: no socket any more (a request in a handler may not have had one
    // seen yet; LeaveHandler ends it).
    std::erase_if(connections_, [](const auto& kv) { return !kv.second.seen && !kv.second.in_handler; });
    std::vector<std::string> close_late, close_crowded;
    std::map<std::string, std::vector<const Connection*>> by_ip;
    for (const auto& [key, c] : connections_) {
      if (!c.seen) continue;
      if (!c.in_handler && now - c.since > options_.request_deadline) {
        close_late.push_back(key);
        continue;
      }
      by_ip[c.ip].push_back(&c);
    }
    for (auto& [ip, list] : by_ip) {
      int over = static_cast<int>(list.size()) - options_.max_per_peer;
      if (over <= 0) continue;
      // The newest first: the limit admits the first ones.
      std::sort(list.begin(), list.end(), [](const Connection* a, const Connection* b) { return a->since > b->since; });
      for (const Connection* c : list) {
        if (over <= 0) break;
        if (c->in_handler) continue;
        close_crowded.push_back(Key(c->ip, c->port));
        --over;
      }
    }
    for (const auto& [keys, answer, reason] :
         {std::tuple{&close_late, late.c_str(), "request_deadline"},
          std::tuple{&close_crowded, crowded.c_str(), "peer_limit"}}) {
      for (const std::string& key : *keys) {
        auto it = connections_.find(key);
        if (it == connections_.end()) continue;
        if (Close(it->second, answer)) reasons.push_back(reason);
        connections_.erase(it);
      }
    }
  }
  for (const char* r : reasons) {
    if (closed_) closed_(r);
  }
  return static_cast<int>(reasons.size());
}

}  // namespace circuitlab::http
