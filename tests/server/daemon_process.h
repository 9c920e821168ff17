// The kilnd process of the tests against a real daemon, started on
// 127.0.0.1:0 with a given data dir, its port read from --port_file. No
// protobuf or gRPC here: kiln_c_test links only libkiln_c.so, which holds
// the kiln.v1 messages (a second copy in the process would abort
// libprotobuf). The test target defines KILN_KILND (the daemon binary's
// path; $KILN_KILND overrides it, for test binaries carried to another
// machine in the relocatable bundle).
#ifndef KILN_TESTS_SERVER_DAEMON_PROCESS_H_
#define KILN_TESTS_SERVER_DAEMON_PROCESS_H_

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace kiln::testing {

class DaemonProcess {
 public:
  // Starts kilnd and waits (up to 30 s) until it serves; port() is 0 if it
  // did not come up.
  // `extra_args` are appended to the command line (later flags win). The
  // metrics endpoint takes an ephemeral port, so tests running side by side
  // never contend for kilnd's fixed default.
  DaemonProcess(const std::string& data_dir, const std::string& port_file,
                const std::vector<std::string>& extra_args = {}) {
    std::filesystem::remove(port_file);
    const char* kilnd_env = std::getenv("KILN_KILND");
    std::vector<std::string> args = {
        kilnd_env && *kilnd_env ? kilnd_env : KILN_KILND,
        "--listen=127.0.0.1:0",
        "--metrics_listen=127.0.0.1:0",
        "--data_dir=" + data_dir,
        "--port_file=" + port_file,
        "--compile_threads=2"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) !=
        0)
      pid_ = -1;
    const absl::Time until = absl::Now() + absl::Seconds(30);
    while (absl::Now() < until && !std::filesystem::exists(port_file)) {
      // A daemon that exits before serving (a startup error) ends the wait.
      int status = 0;
      if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        early_exit_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    std::ifstream(port_file) >> port_;
  }
  DaemonProcess(const DaemonProcess&) = delete;
  DaemonProcess& operator=(const DaemonProcess&) = delete;
  ~DaemonProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  // The exit status of a daemon that exited before serving (refused its
  // flags), else nullopt.
  std::optional<int> early_exit() const { return early_exit_; }
  // Sends `sig` (SIGHUP: reload) to the running daemon.
  void Signal(int sig) const {
    if (pid_ > 0) kill(pid_, sig);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // Waits up to `timeout` for the daemon to exit by itself: its exit status
  // (-1 if killed by a signal), or nullopt if it still runs.
  std::optional<int> WaitForExit(absl::Duration timeout) {
    if (pid_ <= 0 && early_exit_.has_value()) return early_exit_;
    const absl::Time until = absl::Now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      if (absl::Now() >= until) return std::nullopt;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return std::nullopt;
  }
  // SIGTERM and wait: the exit status (0 on a clean drain).
  int Stop() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::optional<int> early_exit_;  // exit status of a daemon that never served
};

}  // namespace kiln::testing

#endif  // KILN_TESTS_SERVER_DAEMON_PROCESS_H_
