// Shared pieces of the CUDA runtime tests: hand-written PTX kernels and
// hand-built artifacts around them (no Kiln compiler involved), and the
// skip for machines without a CUDA device.
#ifndef KILN_TESTS_UNIT_CUDA_TEST_UTIL_H_
#define KILN_TESTS_UNIT_CUDA_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "runtime/cuda_driver.h"
#include "gtest/gtest.h"
#include "kiln/v1/artifact.pb.h"
#include "support/sha256.h"

namespace kiln {
namespace testing_cuda {

// The driver, when it loads and sees at least one device; otherwise why not.
inline absl::StatusOr<const cuda::Driver*> DriverWithDevice() {
  absl::StatusOr<const cuda::Driver*> driver = cuda::Driver::Get();
  if (!driver.ok()) return driver.status();
  int count = 0;
  if (absl::Status s = (*driver)->Check(
          (*driver)->api().cuDeviceGetCount(&count), "cuDeviceGetCount");
      !s.ok()) {
    return s;
  }
  if (count < 1) return absl::FailedPreconditionError("no device");
  return driver;
}

// Skips the current test (with the reason in the output) where there is no
// CUDA device; else binds `driver` to the loaded driver.
#define KILN_REQUIRE_CUDA_DEVICE(driver)                          \
  const ::kiln::cuda::Driver* driver = nullptr;                   \
  {                                                               \
    auto kiln_driver = ::kiln::testing_cuda::DriverWithDevice();  \
    if (!kiln_driver.ok()) {                                      \
      GTEST_SKIP() << "no CUDA device: " << kiln_driver.status(); \
    }                                                             \
    driver = *kiln_driver;                                        \
  }

// Three pointwise kernels over n = 4 * s0 float32 elements, one element
// per thread, following the runtime's ABI: buffers as device pointers,
// then the program's one symbol s0 as int64.
//   add_one(x, y, s0):    y[i] = x[i] + 1
//   scale_two(x, t, s0):  t[i] = 2 * x[i]
//   add_tensors(a, b, y, s0): y[i] = a[i] + b[i]
// PTX ISA 7.5 for sm_75: the driver compiles it for the device it finds
// (every GPU CUDA 13 supports). cuModuleLoadData takes NUL-terminated PTX
// in place of a cubin.
inline constexpr char kPointwisePtx[] = R"(
.version 7.5
.target sm_75
.address_size 64

.visible .entry add_one(.param .u64 add_one_x, .param .u64 add_one_y,
                        .param .u64 add_one_s0)
{
  .reg .pred %p<2>;
  .reg .b32 %r<4>;
  .reg .b64 %rd<10>;
  .reg .f32 %f<3>;
  ld.param.u64 %rd1, [add_one_x];
  ld.param.u64 %rd2, [add_one_y];
  ld.param.u64 %rd3, [add_one_s0];
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mul.wide.u32 %rd4, %r1, %r2;
  cvt.u64.u32 %rd5, %r3;
  add.s64 %rd4, %rd4, %rd5;
  shl.b64 %rd6, %rd3, 2;
  setp.ge.s64 %p1, %rd4, %rd6;
  @%p1 bra ADD_ONE_DONE;
  shl.b64 %rd7, %rd4, 2;
  cvta.to.global.u64 %rd1, %rd1;
  cvta.to.global.u64 %rd2, %rd2;
  add.s64 %rd8, %rd1, %rd7;
  add.s64 %rd9, %rd2, %rd7;
  ld.global.f32 %f1, [%rd8];
  add.f32 %f2, %f1, 0f3F800000;
  st.global.f32 [%rd9], %f2;
ADD_ONE_DONE:
  ret;
}

.visible .entry scale_two(.param .u64 scale_two_x, .param .u64 scale_two_t,
                          .param .u64 scale_two_s0)
{
  .reg .pred %p<2>;
  .reg .b32 %r<4>;
  .reg .b64 %rd<10>;
  .reg .f32 %f<3>;
  ld.param.u64 %rd1, [scale_two_x];
  ld.param.u64 %rd2, [scale_two_t];
  ld.param.u64 %rd3, [scale_two_s0];
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mul.wide.u32 %rd4, %r1, %r2;
  cvt.u64.u32 %rd5, %r3;
  add.s64 %rd4, %rd4, %rd5;
  shl.b64 %rd6, %rd3, 2;
  setp.ge.s64 %p1, %rd4, %rd6;
  @%p1 bra SCALE_TWO_DONE;
  shl.b64 %rd7, %rd4, 2;
  cvta.to.global.u64 %rd1, %rd1;
  cvta.to.global.u64 %rd2, %rd2;
  add.s64 %rd8, %rd1, %rd7;
  add.s64 %rd9, %rd2, %rd7;
  ld.global.f32 %f1, [%rd8];
  mul.f32 %f2, %f1, 0f40000000;
  st.global.f32 [%rd9], %f2;
SCALE_TWO_DONE:
  ret;
}

.visible .entry add_tensors(.param .u64 add_a, .param .u64 add_b,
                            .param .u64 add_y,
                    .param .u64 add_s0)
{
  .reg .pred %p<2>;
  .reg .b32 %r<4>;
  .reg .b64 %rd<12>;
  .reg .f32 %f<4>;
  ld.param.u64 %rd1, [add_a];
  ld.param.u64 %rd2, [add_b];
  ld.param.u64 %rd10, [add_y];
  ld.param.u64 %rd3, [add_s0];
  mov.u32 %r1, %ctaid.x;
  mov.u32 %r2, %ntid.x;
  mov.u32 %r3, %tid.x;
  mul.wide.u32 %rd4, %r1, %r2;
  cvt.u64.u32 %rd5, %r3;
  add.s64 %rd4, %rd4, %rd5;
  shl.b64 %rd6, %rd3, 2;
  setp.ge.s64 %p1, %rd4, %rd6;
  @%p1 bra ADD_DONE;
  shl.b64 %rd7, %rd4, 2;
  cvta.to.global.u64 %rd1, %rd1;
  cvta.to.global.u64 %rd2, %rd2;
  cvta.to.global.u64 %rd10, %rd10;
  add.s64 %rd8, %rd1, %rd7;
  add.s64 %rd9, %rd2, %rd7;
  add.s64 %rd11, %rd10, %rd7;
  ld.global.f32 %f1, [%rd8];
  ld.global.f32 %f2, [%rd9];
  add.f32 %f3, %f1, %f2;
  st.global.f32 [%rd11], %f3;
ADD_DONE:
  ret;
}
)";

inline constexpr int kBlockThreads = 128;

// A SymPoly: coeff * symbol s (s < 0: the constant coeff).
inline v1::SymPoly Poly(int64_t coeff, int symbol = -1) {
  v1::SymPoly p;
  v1::SymPoly::Term* t = p.add_terms();
  t->set_coeff(coeff);
  if (symbol >= 0) t->add_symbols(symbol);
  return p;
}

// Sets binary_sha256 to the SHA-256 of the binary.
inline void Seal(v1::Artifact* artifact) {
  const Sha256Digest digest = Sha256(artifact->cuda().cubin());
  artifact->set_binary_sha256(
      std::string(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

// The frame every test artifact shares: format 1, CUDA target, the PTX,
// symbol s0 = input 0's dim 0 (>= 2), input 0 float32 [s0, 4] contiguous
// and 16-byte aligned, output 0 float32 [s0, 4] in `output_buffer`.
inline v1::Artifact Frame(int output_buffer) {
  v1::Artifact a;
  a.set_format_version(1);
  a.mutable_target()->mutable_cuda()->set_arch("sm_75");
  a.mutable_cuda()->set_cubin(kPointwisePtx);
  a.mutable_cuda()->set_arch("sm_75");
  v1::SymbolGuard* s0 = a.add_symbols();
  s0->set_name("s0");
  s0->set_min_value(2);
  s0->set_input(0);
  s0->set_dim(0);
  v1::InputGuard* x = a.add_inputs();
  x->set_dtype(v1::FLOAT32);
  *x->add_sizes() = Poly(1, 0);
  *x->add_sizes() = Poly(4);
  *x->add_strides() = Poly(4);
  *x->add_strides() = Poly(1);
  x->set_alignment(16);
  v1::OutputSpec* y = a.add_outputs();
  y->set_dtype(v1::FLOAT32);
  *y->add_sizes() = Poly(1, 0);
  *y->add_sizes() = Poly(4);
  y->set_buffer(output_buffer);
  return a;
}

inline void AddBuffer(v1::Artifact* a, v1::BufferSpec::Kind kind, int index) {
  v1::BufferSpec* b = a->mutable_program()->add_buffers();
  b->set_kind(kind);
  b->set_index(index);
  b->set_dtype(v1::FLOAT32);
  *b->mutable_elements() = Poly(4, 0);
}

inline void AddLaunch(v1::Artifact* a, const std::string& kernel,
                      std::vector<int> buffers) {
  v1::Launch* l = a->mutable_program()->add_steps()->mutable_launch();
  l->set_kernel(kernel);
  for (int b : buffers) l->add_buffers(b);
  *l->mutable_range() = Poly(4, 0);
  l->set_block_threads(kBlockThreads);
  l->set_items_per_block(kBlockThreads);
}

// y = x + 1 over x: float32 [s0, 4]. Buffers: 0 = x, 1 = y.
inline v1::Artifact AddOneArtifact() {
  v1::Artifact a = Frame(/*output_buffer=*/1);
  AddBuffer(&a, v1::BufferSpec::INPUT, 0);
  AddBuffer(&a, v1::BufferSpec::OUTPUT, 0);
  AddLaunch(&a, "add_one", {0, 1});
  Seal(&a);
  return a;
}

// y = 2x + x through a temp: buffers 0 = x, 1 = t (TEMP), 2 = y; steps
// alloc t, t = scale_two(x), y = add_tensors(t, x), free t.
inline v1::Artifact TwoKernelArtifact() {
  v1::Artifact a = Frame(/*output_buffer=*/2);
  AddBuffer(&a, v1::BufferSpec::INPUT, 0);
  AddBuffer(&a, v1::BufferSpec::TEMP, 0);
  AddBuffer(&a, v1::BufferSpec::OUTPUT, 0);
  a.mutable_program()->add_steps()->set_alloc(1);
  AddLaunch(&a, "scale_two", {0, 1});
  AddLaunch(&a, "add_tensors", {1, 0, 2});
  a.mutable_program()->add_steps()->set_free(1);
  Seal(&a);
  return a;
}

}  // namespace testing_cuda
}  // namespace kiln

#endif  // KILN_TESTS_UNIT_CUDA_TEST_UTIL_H_
