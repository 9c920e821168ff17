// The C API (client/kiln_c.h) through libkiln_c.so, against a real kilnd:
// status objects, creating clients, errors for bad input before any RPC,
// errors from the daemon and from an unreachable one, the CUDA request
// compiled by the daemon (a cubin, no GPU needed) and then looked up, and
// loading it: FAILED_PRECONDITION without a CUDA driver (this machine), a
// handle with its metadata where there is a GPU. Allocators from callbacks.
//
// Links libkiln_c.so only (no kiln_proto: see tests/server/daemon_process.h).
#include "client/kiln_c.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/server/daemon_process.h"

namespace kiln::testing {
namespace {

struct StatusDeleter {
  void operator()(kiln_status* s) const { kiln_status_free(s); }
};
using Status = std::unique_ptr<kiln_status, StatusDeleter>;
struct ClientDeleter {
  void operator()(kiln_client* c) const { kiln_client_destroy(c); }
};
using ClientPtr = std::unique_ptr<kiln_client, ClientDeleter>;
struct ExeDeleter {
  void operator()(kiln_cuda_executable* e) const {
    kiln_cuda_executable_destroy(e);
  }
};
using ExePtr = std::unique_ptr<kiln_cuda_executable, ExeDeleter>;
struct AllocatorDeleter {
  void operator()(kiln_allocator* a) const { kiln_allocator_destroy(a); }
};
using AllocatorPtr = std::unique_ptr<kiln_allocator, AllocatorDeleter>;

std::string ExamplesDir() {
  const char* env = std::getenv("KILN_EXAMPLES_DIR");
  return env && *env ? env : KILN_EXAMPLES_DIR;
}

std::string GraphJson(const std::string& file) {
  std::ifstream in(ExamplesDir() + "/" + file);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_FALSE(ss.str().empty()) << file;
  return ss.str();
}

std::string Message(const Status& s) { return kiln_status_message(s.get()); }
int Code(const Status& s) { return kiln_status_code(s.get()); }

// Whether this process can load CUDA code (a driver and a device).
bool HaveGpu() {
  kiln_allocator* a = nullptr;
  Status s(kiln_allocator_create_caching(0, &a));
  kiln_allocator_destroy(a);
  return s == nullptr;
}

class KilnCTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("kiln_c_test_", getpid(), "_", rand());
    std::filesystem::create_directories(dir_);
    daemon_ = std::make_unique<DaemonProcess>((dir_ / "data").string(),
                                              (dir_ / "port").string());
    ASSERT_GT(daemon_->port(), 0);
  }
  void TearDown() override {
    daemon_.reset();
    std::filesystem::remove_all(dir_);
  }
  ClientPtr NewClient() {
    kiln_client* c = nullptr;
    Status s(kiln_client_create(daemon_->address().c_str(), 60, 2, &c));
    EXPECT_EQ(s, nullptr) << Message(s);
    return ClientPtr(c);
  }
  Status GetCuda(kiln_client* client, const std::string& json,
                 const char* target, ExePtr* exe,
                 kiln_allocator* allocator = nullptr) {
    kiln_cuda_executable* out = nullptr;
    Status s(kiln_client_get_cuda_executable(
        client, json.data(), json.size(), target, /*fast_math=*/0,
        /*device_ordinal=*/0, allocator, &out));
    exe->reset(out);
    if (s) {
      EXPECT_EQ(out, nullptr);
    }
    return s;
  }
  std::filesystem::path dir_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST(KilnC, StatusAndNullHandles) {
  EXPECT_EQ(kiln_c_api_version(), KILN_C_API_VERSION);
  EXPECT_EQ(kiln_status_code(nullptr), KILN_OK);
  EXPECT_STREQ(kiln_status_message(nullptr), "");
  kiln_status_free(nullptr);
  kiln_client_destroy(nullptr);
  kiln_allocator_destroy(nullptr);
  kiln_cuda_executable_destroy(nullptr);
  kiln_cuda_tensor_destroy(nullptr);
  EXPECT_EQ(kiln_cuda_executable_num_outputs(nullptr), 0u);
  EXPECT_EQ(kiln_cuda_executable_output_dtype(nullptr, 0), -1);
  Status s(kiln_client_create(nullptr, 0, -1, nullptr));
  EXPECT_EQ(Code(s), KILN_INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(Message(s), "out is NULL")) << Message(s);
  Status run(
      kiln_cuda_executable_run(nullptr, nullptr, 0, nullptr, nullptr, 0));
  EXPECT_EQ(Code(run), KILN_INVALID_ARGUMENT);
}

int allocations = 0;
int frees = 0;
uint64_t CountingAlloc(size_t bytes, void* stream, void* user) {
  ++*static_cast<int*>(user);
  ++allocations;
  return 0;  // never memory: nothing here should ask for it without a GPU
}
void CountingFree(uint64_t ptr, size_t bytes, void* stream, void* user) {
  ++frees;
}

TEST(KilnC, Allocators) {
  kiln_allocator* a = nullptr;
  Status null_cb(kiln_allocator_create(nullptr, CountingFree, nullptr, &a));
  EXPECT_EQ(Code(null_cb), KILN_INVALID_ARGUMENT);
  EXPECT_EQ(a, nullptr);
  int calls = 0;
  Status ok(kiln_allocator_create(CountingAlloc, CountingFree, &calls, &a));
  ASSERT_EQ(ok, nullptr) << Message(ok);
  EXPECT_NE(a, nullptr);
  kiln_allocator_destroy(a);
  EXPECT_EQ(calls, 0);

  kiln_allocator* caching = nullptr;
  Status c(kiln_allocator_create_caching(0, &caching));
  if (c) {
    EXPECT_EQ(Code(c), KILN_FAILED_PRECONDITION) << Message(c);
    EXPECT_EQ(caching, nullptr);
  }
  kiln_allocator_destroy(caching);
}

// Bad input is refused before anything is sent, with the reason.
TEST_F(KilnCTest, BadRequestsNameTheProblem) {
  ClientPtr client = NewClient();
  ExePtr exe;
  const std::string chain10 = GraphJson("chain10.json");

  Status not_json = GetCuda(client.get(), "{ not json", "sm_90", &exe);
  EXPECT_EQ(Code(not_json), KILN_INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(Message(not_json), "not a kiln.v1.Graph"))
      << Message(not_json);

  Status bad_target = GetCuda(client.get(), chain10, "sm_x", &exe);
  EXPECT_EQ(Code(bad_target), KILN_INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(Message(bad_target), "sm_x"))
      << Message(bad_target);
  Status cpu_target = GetCuda(client.get(), chain10, "cpu", &exe);
  EXPECT_EQ(Code(cpu_target), KILN_INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(Message(cpu_target), "not a CUDA target"))
      << Message(cpu_target);

  std::string missing = chain10;
  const size_t at = missing.find("{\"ref\": \"x\"}");
  ASSERT_NE(at, std::string::npos);
  missing.replace(at, std::strlen("{\"ref\": \"x\"}"), "{\"ref\": \"nope\"}");
  Status bad_graph = GetCuda(client.get(), missing, "sm_90", &exe);
  EXPECT_EQ(Code(bad_graph), KILN_INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(Message(bad_graph), "nope"))
      << Message(bad_graph);

  // The length is honoured: a prefix of a good graph is not a graph.
  kiln_cuda_executable* out = nullptr;
  Status prefix(kiln_client_get_cuda_executable(client.get(), chain10.data(),
                                                chain10.size() / 2, "sm_90", 0,
                                                0, nullptr, &out));
  EXPECT_EQ(Code(prefix), KILN_INVALID_ARGUMENT);
  EXPECT_EQ(out, nullptr);

  uint64_t local = 9, lookups = 9, compiles = 9;
  kiln_client_counters(client.get(), &local, &lookups, &compiles);
  EXPECT_EQ(local + lookups + compiles, 0u);  // nothing reached the daemon
}

// The daemon compiles the CUDA request (a cubin; no GPU needed there), a
// second client gets it by Lookup; loading needs a GPU.
TEST_F(KilnCTest, CudaExecutableCompilesThenLooksUp) {
  const std::string json = GraphJson("softmax.json");
  const bool gpu = HaveGpu();
  for (int round = 0; round < 2; ++round) {
    ClientPtr client = NewClient();
    int calls = 0;
    kiln_allocator* allocator = nullptr;
    Status a(
        kiln_allocator_create(CountingAlloc, CountingFree, &calls, &allocator));
    ASSERT_EQ(a, nullptr);
    AllocatorPtr allocator_owner(allocator);
    ExePtr exe;
    Status s = GetCuda(client.get(), json, "sm_90", &exe, allocator);
    uint64_t local = 0, lookups = 0, compiles = 0;
    kiln_client_counters(client.get(), &local, &lookups, &compiles);
    EXPECT_EQ(compiles, round == 0 ? 1u : 0u) << "round " << round;
    EXPECT_EQ(lookups, round == 0 ? 0u : 1u) << "round " << round;
    if (!gpu) {
      EXPECT_EQ(Code(s), KILN_FAILED_PRECONDITION) << Message(s);
      EXPECT_TRUE(absl::StrContains(Message(s), "CUDA driver not available") ||
                  absl::StrContains(Message(s), "cuInit"))
          << Message(s);
      EXPECT_EQ(exe, nullptr);
    } else if (s == nullptr) {
      EXPECT_EQ(kiln_cuda_executable_num_inputs(exe.get()), 1u);
      ASSERT_EQ(kiln_cuda_executable_num_outputs(exe.get()), 1u);
      EXPECT_EQ(kiln_cuda_executable_output_dtype(exe.get(), 0), KILN_FLOAT32);
      EXPECT_EQ(kiln_cuda_executable_output_rank(exe.get(), 0), 2);
      EXPECT_EQ(kiln_cuda_executable_output_dtype(exe.get(), 1), -1);
      char key[65];
      kiln_cuda_executable_guard_key(exe.get(), key);
      EXPECT_EQ(std::strlen(key), 64u);
      // Wrong output count: refused before running.
      Status run(
          kiln_cuda_executable_run(exe.get(), nullptr, 0, nullptr, nullptr, 0));
      EXPECT_EQ(Code(run), KILN_INVALID_ARGUMENT);
    } else {
      // A GPU that cannot run sm_90 code.
      EXPECT_EQ(Code(s), KILN_FAILED_PRECONDITION) << Message(s);
    }
    EXPECT_EQ(calls, 0);  // loading allocates nothing
  }
}

TEST(KilnCNoServer, UnavailableWhenNothingListens) {
  kiln_client* c = nullptr;
  Status created(kiln_client_create("127.0.0.1:1", 2, 1, &c));
  ASSERT_EQ(created, nullptr) << Message(created);
  ClientPtr client(c);
  const std::string json = GraphJson("chain10.json");
  kiln_cuda_executable* exe = nullptr;
  Status s(kiln_client_get_cuda_executable(
      client.get(), json.data(), json.size(), "sm_90", 0, 0, nullptr, &exe));
  EXPECT_EQ(Code(s), KILN_UNAVAILABLE) << Message(s);
  EXPECT_FALSE(Message(s).empty());
  EXPECT_EQ(exe, nullptr);
}

}  // namespace
}  // namespace kiln::testing
