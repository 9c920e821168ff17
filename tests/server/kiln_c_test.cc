// The C API (client/kiln_c.h) through libkiln_c.so, against a real kilnd:
// status objects, creating clients, errors for bad input before any RPC,
// errors from the daemon and from an unreachable one, the CUDA request
// compiled by the daemon (a cubin, no GPU needed) and then looked up, and
// loading it: FAILED_PRECONDITION without a CUDA driver (this machine), a
// handle with its metadata where there is a GPU. Allocators from callbacks.
// CPU executables run over the test's own memory (strided inputs with a
// storage offset, outputs in caller buffers or allocated by Kiln, symbolic
// sizes), checked against values computed here; the op list.
//
// Links libkiln_c.so only (no kiln_proto: see tests/server/daemon_process.h).
#include "client/kiln_c.h"

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

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
struct CpuExeDeleter {
  void operator()(kiln_cpu_executable* e) const {
    kiln_cpu_executable_destroy(e);
  }
};
using CpuExePtr = std::unique_ptr<kiln_cpu_executable, CpuExeDeleter>;
struct CpuTensorDeleter {
  void operator()(kiln_cpu_tensor* t) const { kiln_cpu_tensor_destroy(t); }
};
using CpuTensorPtr = std::unique_ptr<kiln_cpu_tensor, CpuTensorDeleter>;

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

kiln_tensor_view View(const void* data, int rank, const int64_t* sizes,
                      const int64_t* strides, int dtype = KILN_FLOAT32) {
  return kiln_tensor_view{reinterpret_cast<uint64_t>(data), dtype, rank, sizes,
                          strides};
}

// Softmax over rows of 64x1024 into the caller's buffer; a second client
// gets it by Lookup; a third call on the first client from its cache.
TEST_F(KilnCTest, CpuExecutableRunsIntoCallerMemory) {
  const std::string json = GraphJson("softmax.json");
  const int64_t sizes[] = {64, 1024};
  std::vector<float> x(64 * 1024), y(64 * 1024, -1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * i) * 3;
  for (int round = 0; round < 2; ++round) {
    ClientPtr client = NewClient();
    kiln_cpu_executable* raw = nullptr;
    Status s(kiln_client_get_cpu_executable(client.get(), json.data(),
                                            json.size(), "cpu", 0, &raw));
    ASSERT_EQ(s, nullptr) << Message(s);
    CpuExePtr exe(raw);
    uint64_t local = 0, lookups = 0, compiles = 0;
    kiln_client_counters(client.get(), &local, &lookups, &compiles);
    EXPECT_EQ(compiles, round == 0 ? 1u : 0u) << "round " << round;
    EXPECT_EQ(lookups, round == 0 ? 0u : 1u) << "round " << round;
    EXPECT_EQ(kiln_cpu_executable_num_inputs(exe.get()), 1u);
    ASSERT_EQ(kiln_cpu_executable_num_outputs(exe.get()), 1u);
    EXPECT_EQ(kiln_cpu_executable_output_dtype(exe.get(), 0), KILN_FLOAT32);
    EXPECT_EQ(kiln_cpu_executable_output_rank(exe.get(), 0), 2);
    EXPECT_EQ(kiln_cpu_executable_output_rank(exe.get(), 1), -1);
    char key[65];
    kiln_cpu_executable_guard_key(exe.get(), key);
    EXPECT_EQ(std::strlen(key), 64u);

    const kiln_tensor_view in = View(x.data(), 2, sizes, nullptr);
    const kiln_tensor_view out = View(y.data(), 2, sizes, nullptr);
    Status run(kiln_cpu_executable_run(exe.get(), &in, 1, &out, 1));
    ASSERT_EQ(run, nullptr) << Message(run);
    for (int r = 0; r < 64; r += 9) {
      double max = -INFINITY, sum = 0;
      for (int c = 0; c < 1024; ++c)
        max = std::max<double>(max, x[r * 1024 + c]);
      for (int c = 0; c < 1024; ++c) sum += std::exp(x[r * 1024 + c] - max);
      for (int c = 0; c < 1024; c += 37) {
        EXPECT_NEAR(y[r * 1024 + c], std::exp(x[r * 1024 + c] - max) / sum,
                    1e-6)
            << r << "," << c;
      }
    }
  }
}

// An input with a storage offset and strides (the columns 1..16 of a 16x20
// row-major buffer, transposed), as the graph declares them; outputs
// allocated by Kiln; symbolic sizes and output_sizes.
TEST_F(KilnCTest, CpuStridedInputsAndSymbolicSizes) {
  // y = x * 2 + 1 over a transposed view: sizes (16, 16), strides (1, 20).
  const std::string json = R"({
    "inputs": [{"name": "x", "meta": {"dtype": "FLOAT32",
      "sizes": [{"value": "16"}, {"value": "16"}],
      "strides": [{"value": "1"}, {"value": "20"}], "storage_offset": "1"}}],
    "nodes": [
      {"op": "aten.mul.Tensor", "args": [{"ref": "x"}, {"f": 2.0}], "outputs": ["a"]},
      {"op": "aten.add.Tensor", "args": [{"ref": "a"}, {"f": 1.0}], "outputs": ["y"]}],
    "outputs": ["y"]})";
  ClientPtr client = NewClient();
  kiln_cpu_executable* raw = nullptr;
  Status s(kiln_client_get_cpu_executable(client.get(), json.data(),
                                          json.size(), nullptr, 0, &raw));
  ASSERT_EQ(s, nullptr) << Message(s);
  CpuExePtr exe(raw);
  std::vector<float> storage(16 * 20);
  for (size_t i = 0; i < storage.size(); ++i) storage[i] = i;
  const int64_t sizes[] = {16, 16}, strides[] = {1, 20};
  const kiln_tensor_view in = View(storage.data() + 1, 2, sizes, strides);
  kiln_cpu_tensor* out_raw = nullptr;
  Status run(kiln_cpu_executable_run_alloc(exe.get(), &in, 1, &out_raw, 1));
  ASSERT_EQ(run, nullptr) << Message(run);
  CpuTensorPtr out(out_raw);
  ASSERT_EQ(kiln_cpu_tensor_rank(out.get()), 2);
  EXPECT_EQ(kiln_cpu_tensor_dtype(out.get()), KILN_FLOAT32);
  EXPECT_EQ(kiln_cpu_tensor_sizes(out.get())[0], 16);
  EXPECT_EQ(kiln_cpu_tensor_strides(out.get())[0], 16);
  EXPECT_EQ(kiln_cpu_tensor_nbytes(out.get()), 16u * 16 * 4);
  const float* y = static_cast<const float*>(kiln_cpu_tensor_data(out.get()));
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      ASSERT_EQ(y[i * 16 + j], storage[1 + i + 20 * j] * 2 + 1)
          << i << "," << j;
    }
  }
  // Contiguous strides fail the guard, naming it.
  const kiln_tensor_view contiguous = View(storage.data(), 2, sizes, nullptr);
  Status guard(
      kiln_cpu_executable_run_alloc(exe.get(), &contiguous, 1, &out_raw, 1));
  EXPECT_EQ(Code(guard), KILN_INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(Message(guard), "input 0")) << Message(guard);

  // dynamic_batch.json: x (s0, 16), scale (16) -> mean over dim 1: (s0).
  const std::string dynamic = GraphJson("dynamic_batch.json");
  Status d(kiln_client_get_cpu_executable(client.get(), dynamic.data(),
                                          dynamic.size(), "cpu", 0, &raw));
  ASSERT_EQ(d, nullptr) << Message(d);
  CpuExePtr dyn(raw);
  std::vector<float> xs(5 * 16), scale(16), means(5, -1.0f);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = 0.01f * i;
  for (int i = 0; i < 16; ++i) scale[i] = 0.5f + 0.1f * i;
  const int64_t x_sizes[] = {5, 16}, scale_sizes[] = {16};
  const kiln_tensor_view ins[] = {View(xs.data(), 2, x_sizes, nullptr),
                                  View(scale.data(), 1, scale_sizes, nullptr)};
  int64_t out_sizes[1] = {0};
  Status os(kiln_cpu_executable_output_sizes(dyn.get(), ins, 2, out_sizes, 1));
  ASSERT_EQ(os, nullptr) << Message(os);
  EXPECT_EQ(out_sizes[0], 5);
  Status room(
      kiln_cpu_executable_output_sizes(dyn.get(), ins, 2, out_sizes, 2));
  EXPECT_EQ(Code(room), KILN_INVALID_ARGUMENT);
  const kiln_tensor_view out_view = View(means.data(), 1, out_sizes, nullptr);
  Status r(kiln_cpu_executable_run(dyn.get(), ins, 2, &out_view, 1));
  ASSERT_EQ(r, nullptr) << Message(r);
  for (int b = 0; b < 5; ++b) {
    double sum = 0;
    for (int i = 0; i < 16; ++i)
      sum += std::tanh(xs[b * 16 + i] * scale[i] + 1);
    EXPECT_NEAR(means[b], sum / 16, 1e-5) << b;
  }
  // Outputs that do not match what the program writes are refused.
  const int64_t wrong_sizes[] = {4};
  const kiln_tensor_view wrong = View(means.data(), 1, wrong_sizes, nullptr);
  Status bad_size(kiln_cpu_executable_run(dyn.get(), ins, 2, &wrong, 1));
  EXPECT_EQ(Code(bad_size), KILN_INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(Message(bad_size), "output 0: sizes [4]"))
      << Message(bad_size);
  const kiln_tensor_view wrong_dtype =
      View(means.data(), 1, out_sizes, nullptr, KILN_INT32);
  Status bad_dtype(kiln_cpu_executable_run(dyn.get(), ins, 2, &wrong_dtype, 1));
  EXPECT_EQ(Code(bad_dtype), KILN_INVALID_ARGUMENT);
  Status count(kiln_cpu_executable_run(dyn.get(), ins, 2, nullptr, 0));
  EXPECT_EQ(Code(count), KILN_INVALID_ARGUMENT);
  Status cuda(kiln_client_get_cpu_executable(client.get(), dynamic.data(),
                                             dynamic.size(), "sm_90", 0, &raw));
  EXPECT_EQ(Code(cuda), KILN_INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(Message(cuda), "not a CPU target"))
      << Message(cuda);
  // Options are KILN_OPTION_* flags: an unknown bit is refused before any
  // request; the matrix-product and convolution flags are not part of a CPU
  // key, so the
  // executable is the one compiled without them (no second compile).
  Status unknown(kiln_client_get_cpu_executable(
      client.get(), dynamic.data(), dynamic.size(), "cpu", 512, &raw));
  EXPECT_EQ(Code(unknown), KILN_INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(Message(unknown), "unknown bits 0x200"))
      << Message(unknown);
  uint64_t before[3], after[3];
  kiln_client_counters(client.get(), &before[0], &before[1], &before[2]);
  Status flagged(kiln_client_get_cpu_executable(
      client.get(), dynamic.data(), dynamic.size(), "cpu",
      KILN_OPTION_ALLOW_TF32 | KILN_OPTION_STRICT_BF16_REDUCTION |
          KILN_OPTION_UNFUSED_GEMM_EPILOGUES |
          KILN_OPTION_ALLOW_TF32_CONVOLUTION |
          KILN_OPTION_DETERMINISTIC_CONVOLUTIONS |
          KILN_OPTION_DETERMINISTIC_ALGORITHMS | KILN_OPTION_CUDNN_BENCHMARK,
      &raw));
  ASSERT_EQ(Code(flagged), KILN_OK) << Message(flagged);
  kiln_cpu_executable_destroy(raw);
  kiln_client_counters(client.get(), &after[0], &after[1], &after[2]);
  EXPECT_EQ(after[2], before[2]) << "a CPU request with cuBLASLt flags "
                                    "compiled again";
}

// $KILN_TRUSTED_KEYS reaches C API (and so Python) clients: an artifact not
// signed by a trusted key is refused with KILN_PERMISSION_DENIED, and a
// malformed list fails at kiln_client_create.
TEST_F(KilnCTest, TrustedKeysFromTheEnvironment) {
  const std::string json = GraphJson("softmax.json");
  ASSERT_EQ(setenv("KILN_TRUSTED_KEYS", std::string(64, 'a').c_str(), 1), 0);
  {
    ClientPtr client = NewClient();
    kiln_cpu_executable* raw = nullptr;
    Status s(kiln_client_get_cpu_executable(client.get(), json.data(),
                                            json.size(), "cpu", 0, &raw));
    EXPECT_EQ(Code(s), KILN_PERMISSION_DENIED) << Message(s);
    EXPECT_EQ(raw, nullptr);
  }
  ASSERT_EQ(setenv("KILN_TRUSTED_KEYS", "nonsense", 1), 0);
  kiln_client* c = nullptr;
  Status bad(kiln_client_create(daemon_->address().c_str(), 60, 2, &c));
  EXPECT_EQ(Code(bad), KILN_INVALID_ARGUMENT) << Message(bad);
  EXPECT_TRUE(absl::StrContains(Message(bad), "nonsense"));
  EXPECT_EQ(c, nullptr);
  unsetenv("KILN_TRUSTED_KEYS");
  ClientPtr plain = NewClient();
  kiln_cpu_executable* raw = nullptr;
  Status ok(kiln_client_get_cpu_executable(plain.get(), json.data(),
                                           json.size(), "cpu", 0, &raw));
  EXPECT_EQ(ok, nullptr) << Message(ok);
  CpuExePtr exe(raw);
}

TEST(KilnC, SupportedOps) {
  const std::string ops = kiln_supported_ops();
  EXPECT_TRUE(absl::StrContains(ops, "aten.add.Tensor\n")) << ops;
  EXPECT_TRUE(absl::StrContains(ops, "aten._softmax.default\n")) << ops;
  EXPECT_FALSE(absl::StrContains(ops, "aten.kthvalue.default")) << ops;
  EXPECT_NE(ops.back(), '\n');
}

TEST(KilnC, CpuRuntimePrepareIsIdempotent) {
  // The BLAS CI installs loads; a second call finds it loaded.
  for (int i = 0; i < 2; ++i) {
    kiln_status* s = kiln_cpu_runtime_prepare();
    EXPECT_EQ(s, nullptr) << (s ? kiln_status_message(s) : "");
    kiln_status_free(s);
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
