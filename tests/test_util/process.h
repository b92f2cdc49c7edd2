// Helpers for end-to-end tests that drive the real binaries: run a command
// and capture its output and exit code; start the server as a child process
// on an ephemeral port and stop it with a chosen signal.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

namespace circuitlab::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout and stderr, interleaved
};

// Runs `argv` to completion (no shell).
inline CommandResult RunCommand(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  CommandResult r;
  std::array<char, 4096> buf;
  ssize_t n;
  while ((n = read(fds[0], buf.data(), buf.size())) > 0) r.out.append(buf.data(), n);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// A circuitlab-server child process listening on 127.0.0.1:<ephemeral>.
class ServerProcess {
 public:
  ServerProcess(const std::string& binary, const std::string& data_dir, std::vector<std::string> extra = {}) {
    int fds[2];
    if (pipe(fds) != 0) return;
    log_path_ = data_dir + ".server.log";
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      int log = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(log, 2);
      close(fds[0]);
      close(fds[1]);
      std::vector<std::string> argv = {binary, "--data", data_dir, "--listen", "127.0.0.1:0", "--log-level", "info"};
      // An ephemeral HTTP port unless the test chose one (parallel servers never share 8080).
      if (std::find(extra.begin(), extra.end(), "--http") == extra.end())
        argv.insert(argv.end(), {"--http", "127.0.0.1:0"});
      argv.insert(argv.end(), extra.begin(), extra.end());
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    // The server prints "listening port=N" once it serves, then "http port=N url=U"
    // when it has an HTTP port.
    std::string line;
    char c;
    while (read(fds[0], &c, 1) == 1) {
      if (c == '\n') {
        if (line.rfind("listening port=", 0) == 0) {
          port_ = std::stoi(line.substr(15));
          if (HttpOff(extra)) break;
          line.clear();
          continue;
        }
        if (line.rfind("http port=", 0) == 0) {
          http_port_ = std::stoi(line.substr(10));
          break;
        }
        line.clear();
      } else {
        line += c;
      }
    }
    stdout_fd_ = fds[0];
  }
  ~ServerProcess() { Stop(SIGKILL); }

  bool ok() const { return port_ > 0; }
  int http_port() const { return http_port_; }
  pid_t pid() const { return pid_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  const std::string& log_path() const { return log_path_; }

  // Sends `sig` and waits; returns the exit code (128 + signal if killed).
  int Stop(int sig) {
    if (pid_ <= 0) return exit_code_;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    if (stdout_fd_ >= 0) close(stdout_fd_);
    stdout_fd_ = -1;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return exit_code_;
  }

 private:
  pid_t pid_ = -1;
  static bool HttpOff(const std::vector<std::string>& extra) {
    auto it = std::find(extra.begin(), extra.end(), "--http");
    return it != extra.end() && it + 1 != extra.end() && it[1].empty();
  }
  int port_ = 0;
  int http_port_ = 0;
  int stdout_fd_ = -1;
  int exit_code_ = -1;
  std::string log_path_;
};

}  // namespace circuitlab::testing
