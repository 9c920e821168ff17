// Shared by the tests against a real kilnd (kilnd_test, client_test,
// kilnctl_test): the daemon process (daemon_process.h) with a stub for it;
// and requests from the example graphs. The test target defines KILN_KILND
// (see daemon_process.h) and KILN_EXAMPLES_DIR, and links kiln_cpu_backend
// (HostCpuTarget).
#ifndef KILN_TESTS_SERVER_DAEMON_H_
#define KILN_TESTS_SERVER_DAEMON_H_

#include <unistd.h>

#include <chrono>
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
#include "tests/server/daemon_process.h"
#include "tests/unit/example_graphs.h"

namespace kiln::testing {

class Daemon : public DaemonProcess {
 public:
  using DaemonProcess::DaemonProcess;
  std::unique_ptr<v1::Kiln::Stub> Stub() const {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(256 << 20);
    return v1::Kiln::NewStub(grpc::CreateCustomChannel(
        address(), grpc::InsecureChannelCredentials(), args));
  }
};

// Compile on `stub` with a 120 s deadline.
inline grpc::Status Call(v1::Kiln::Stub& stub, const v1::CompileRequest& req,
                         v1::CompileResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::seconds(120));
  return stub.Compile(&ctx, req, resp);
}

// GetStats on `stub` (a failed call fails the test).
inline v1::Stats Stats(v1::Kiln::Stub& stub) {
  grpc::ClientContext ctx;
  v1::Stats s;
  EXPECT_TRUE(stub.GetStats(&ctx, v1::GetStatsRequest(), &s).ok());
  return s;
}

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
