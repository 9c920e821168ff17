// Shared by the tests against a real kilnd (kilnd_test, client_test,
// kilnctl_test): the daemon process, started on 127.0.0.1:0 with a given
// data dir, its port read from --port_file; and requests from the example
// graphs. The test target defines KILN_KILND (the daemon binary's path) and
// KILN_EXAMPLES_DIR, and links kiln_cpu_backend (HostCpuTarget).
#ifndef KILN_TESTS_SERVER_DAEMON_H_
#define KILN_TESTS_SERVER_DAEMON_H_

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "compiler/cpu_backend.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kiln/v1/service.grpc.pb.h"
#include "tests/unit/example_graphs.h"

extern char** environ;

namespace kiln::testing {

class Daemon {
 public:
  // Starts kilnd and waits (up to 30 s) until it serves; port() is 0 if it
  // did not come up.
  // `extra_args` are appended to the command line (later flags win). The
  // metrics endpoint takes an ephemeral port, so tests running side by side
  // never contend for kilnd's fixed default.
  Daemon(const std::string& data_dir, const std::string& port_file,
         const std::vector<std::string>& extra_args = {}) {
    std::filesystem::remove(port_file);
    std::vector<std::string> args = {KILN_KILND,
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
    while (absl::Now() < until && !std::filesystem::exists(port_file))
      absl::SleepFor(absl::Milliseconds(20));
    std::ifstream(port_file) >> port_;
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // SIGTERM and wait: the exit status (0 on a clean drain).
  int Stop() {
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  std::unique_ptr<v1::Kiln::Stub> Stub() const {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    return v1::Kiln::NewStub(grpc::CreateCustomChannel(
        address(), grpc::InsecureChannelCredentials(), args));
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

// A test with its own temp dir and a kilnd serving from it.
class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("kiln_daemon_test_", getpid(), "_", rand());
    std::filesystem::create_directories(dir_);
    daemon_ = std::make_unique<Daemon>((dir_ / "data").string(),
                                       (dir_ / "port").string());
    ASSERT_GT(daemon_->port(), 0);
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::filesystem::path dir_;
  std::unique_ptr<Daemon> daemon_;
};

}  // namespace kiln::testing

#endif  // KILN_TESTS_SERVER_DAEMON_H_
