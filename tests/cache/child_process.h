// A child process for the cache tests: fork/exec with stdout on a pipe,
// optionally as user nobody. RAII: the destructor kills and reaps a child that
// is still running and closes the pipe.
#ifndef KILN_TESTS_CACHE_CHILD_PROCESS_H_
#define KILN_TESTS_CACHE_CHILD_PROCESS_H_

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kiln::cache_test {

// Exit codes of the forked child before exec.
inline constexpr int kExecFailed = 127;
inline constexpr int kCannotDropPrivileges = 120;
inline constexpr uid_t kNobody = 65534;

class ChildProcess {
 public:
  // Starts argv[0] with `argv`; with `as_nobody`, first drops to uid/gid
  // 65534 (the caller must be root). Returns nullptr if fork or pipe fail.
  static std::unique_ptr<ChildProcess> Spawn(
      const std::vector<std::string>& argv, bool as_nobody = false) {
    std::vector<char*> args;
    for (const std::string& arg : argv) {
      args.push_back(const_cast<char*>(arg.c_str()));
    }
    args.push_back(nullptr);
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return nullptr;
    const pid_t pid = fork();
    if (pid < 0) {
      close(fds[0]);
      close(fds[1]);
      return nullptr;
    }
    if (pid == 0) {
      // Only async-signal-safe calls between fork and exec.
      if (dup2(fds[1], STDOUT_FILENO) < 0) _exit(kExecFailed);
      if (as_nobody && (setgroups(0, nullptr) != 0 || setgid(kNobody) != 0 ||
                        setuid(kNobody) != 0)) {
        _exit(kCannotDropPrivileges);
      }
      execv(args[0], args.data());
      _exit(kExecFailed);
    }
    close(fds[1]);
    return std::make_unique<ChildProcess>(pid, fds[0]);
  }

  ~ChildProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int status;
      waitpid(pid_, &status, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // Collects the child's output until `until` or its end of output.
  void ReadUntil(absl::Time until) {
    while (fd_ >= 0) {
      const absl::Duration left = until - absl::Now();
      if (left <= absl::ZeroDuration()) return;
      pollfd pfd = {fd_, POLLIN, 0};
      const int ready =
          poll(&pfd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
      if (ready < 0 && errno != EINTR) return;
      if (ready > 0 && !ReadSome()) return;
    }
  }

  // Collects output until it holds a complete line, `until`, or its end.
  void ReadUntilLine(absl::Time until) {
    while (fd_ >= 0 && output_.find('\n') == std::string::npos &&
           absl::Now() < until) {
      ReadUntil(std::min(until, absl::Now() + absl::Milliseconds(10)));
    }
  }

  void Kill() {
    if (pid_ > 0) kill(pid_, SIGKILL);
  }

  // Reads the rest of the output (bounded by `timeout`), reaps the child and
  // returns its wait status (-1 if it could not be reaped in time: it is then
  // killed by the destructor).
  int Wait(absl::Duration timeout = absl::Seconds(60)) {
    const absl::Time until = absl::Now() + timeout;
    ReadUntil(until);
    while (pid_ > 0 && absl::Now() < until) {
      int status;
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        pid_ = -1;
        return status;
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return -1;
  }

  const std::string& output() const { return output_; }

  // Takes over a started child and the read end of its stdout pipe; Spawn
  // is the way to get one.
  ChildProcess(pid_t pid, int fd) : pid_(pid), fd_(fd) {}

 private:
  // Returns false at end of output.
  bool ReadSome() {
    char buffer[4096];
    const ssize_t n = read(fd_, buffer, sizeof(buffer));
    if (n > 0) {
      output_.append(buffer, static_cast<size_t>(n));
      return true;
    }
    if (n < 0 && errno == EINTR) return true;
    close(fd_);
    fd_ = -1;
    return false;
  }

  pid_t pid_;
  int fd_;
  std::string output_;
};

}  // namespace kiln::cache_test

#endif  // KILN_TESTS_CACHE_CHILD_PROCESS_H_
