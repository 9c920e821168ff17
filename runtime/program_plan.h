// The checked form of an artifact's program, shared by the CPU and CUDA
// runtimes: every buffer, step and launch is validated once, at load time,
// before any code of the artifact runs, so Run only evaluates sizes and
// never indexes out of range. A program that fails the check is refused with
// a precise error; the runtimes never trust the server's bytes beyond it.
//
// Thread-safety: pure functions; a ProgramPlan is a plain value.
#ifndef KILN_RUNTIME_PROGRAM_PLAN_H_
#define KILN_RUNTIME_PROGRAM_PLAN_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "graph/dtype.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln {

// Pointers point into the artifact the plan was made from, which must
// outlive the plan and not move.
struct ProgramPlan {
  struct Launch {
    const std::string* kernel = nullptr;
    const v1::SymPoly* range = nullptr;
    int64_t grain = 1;            // CPU: elements per chunk at least
    int64_t items_per_block = 1;  // CUDA
    unsigned block_threads = 1;   // CUDA
    int first_slot = 0;           // into launch_slots
    int num_slots = 0;
  };
  // A library call (ExternCall): the GEMM or the convolution, and its
  // operands' buffer ids (a convolution's: its input, weight and output).
  struct Extern {
    const v1::Gemm* gemm = nullptr;
    const v1::Convolution* conv = nullptr;
    const v1::Attention* attention = nullptr;  // its buffers: attention's
    int a = 0, b = 0, c = 0;
    int bias = -1;  // the epilogue's bias vector, when it has one
    DType dtype = DType::kFloat32;          // of A, B, C and the bias
    DType compute_dtype = DType::kFloat32;  // accumulation
    DType c_dtype = DType::kFloat32;        // C's (Gemm.c_dtype, else dtype)
  };
  struct Step {
    enum class Kind : uint8_t { kAlloc, kFree, kLaunch, kExtern };
    Kind kind;
    int index;  // buffer id (alloc/free), launch or extern index
  };
  struct Output {
    int buffer = 0;
    DType dtype = DType::kFloat32;
    const v1::OutputSpec* spec = nullptr;
    const v1::SymPoly* elements = nullptr;  // the buffer's element count
  };

  std::vector<Step> steps;
  std::vector<Launch> launches;
  std::vector<Extern> externs;
  std::vector<int> launch_slots;  // buffer ids, per launch in slot order
  std::vector<std::pair<int, int>> input_buffers;  // (buffer id, input)
  std::vector<Output> outputs;
  std::vector<int> temp_slot;         // per buffer: index among temps, or -1
  // Temps of a static size of at most LaunchLimits::arena_temp_bytes: they
  // live in one allocation per run (the arena, arena_bytes long), at
  // arena_offset[buffer] bytes into it (-1 for every other buffer), and
  // have no kAlloc/kFree steps: a run makes one allocation for all of them
  // instead of one each (each is a call into the caller's allocator).
  std::vector<int64_t> arena_offset;
  int64_t arena_bytes = 0;
  std::vector<int64_t> element_size;  // per buffer, bytes
  int num_temps = 0;
  int max_params = 0;  // buffers + symbols of the widest launch
  // The ERROR buffer of the index checks (artifact.proto, IndexCheck): the
  // runtime binds it to a zeroed int64[3] word and reads it after the run
  // (IndexErrorStatus); -1 when the program checks no index.
  int error_buffer = -1;
};

// What a runtime's launches can take.
struct LaunchLimits {
  // Launches must name a block of 1..max_block_threads threads and at least
  // one item per block; 0: launches have no block geometry (CPU).
  int max_block_threads = 0;
  // Buffers + symbols one launch may pass; 0: no limit.
  int max_kernel_params = 0;
  // The library this runtime makes extern calls with (BLAS on the CPU,
  // cuBLASLt on GPUs); LIBRARY_UNSPECIFIED: it makes none.
  v1::ExternCall::Library extern_library = v1::ExternCall::LIBRARY_UNSPECIFIED;
  // The (data, compute) dtype pairs its GEMMs take.
  std::vector<std::pair<DType, DType>> gemm_dtypes;
  // (A's and B's dtype, C's) of products whose C is of another dtype
  // (Gemm.c_dtype): bfloat16 operands with a float32 C on the CPU.
  std::vector<std::pair<DType, DType>> gemm_mixed_dtypes;
  // Whether its GEMMs apply epilogues (v1::Gemm::epilogue) and take the
  // tf32 and strict_reduction flags (cuBLASLt); a CPU BLAS does neither.
  bool gemm_epilogues = false;
  // The library its convolutions call (cuDNN on GPUs), and the dtypes they
  // take; LIBRARY_UNSPECIFIED: it makes none.
  v1::ExternCall::Library conv_library = v1::ExternCall::LIBRARY_UNSPECIFIED;
  std::vector<DType> conv_dtypes;
  // (operands' dtype, written tensor's) of convolutions whose written
  // tensor is of another dtype (Convolution.result_dtype).
  std::vector<std::pair<DType, DType>> conv_mixed_dtypes;
  // The library its fused attention calls (cuDNN on GPUs, Kiln's own
  // kernel on the CPU) and the dtypes it takes; LIBRARY_UNSPECIFIED: it
  // runs none.
  v1::ExternCall::Library attention_library =
      v1::ExternCall::LIBRARY_UNSPECIFIED;
  std::vector<DType> attention_dtypes;
  // Whether its attention backward also gives the bias's gradient
  // (Attention.bias_grad).
  bool attention_bias_grad = false;
  // Temps of a static size up to this many bytes share one allocation per
  // run (ProgramPlan::arena_offset); 0: every temp is allocated by its own
  // step.
  int64_t arena_temp_bytes = 0;
};

// One matrix of a GEMM as a library takes it, for given symbol values:
// `ld` is the leading dimension of its row-major storage, or of its
// transpose's when `transposed` (the matrix is stored column-major).
struct GemmMatrix {
  int64_t offset = 0;        // elements into the buffer
  int64_t batch_stride = 0;  // elements between the matrices of a batch
  int64_t ld = 1;
  bool transposed = false;
};
struct GemmDims {
  int64_t batch = 0, m = 0, n = 0, k = 0;
  GemmMatrix a, b, c;       // c is never transposed
  int64_t bias_offset = 0;  // elements into the bias buffer, when there is one
};

// Whether a GEMM epilogue has a bias vector: one it adds (BIAS, RELU_BIAS,
// GELU_TANH_BIAS) or one it writes (BGRAD_B, BGRAD_A:
// GemmEpilogueWritesBias).
bool GemmEpilogueHasBias(v1::Gemm::Epilogue epilogue);
bool GemmEpilogueWritesBias(v1::Gemm::Epilogue epilogue);

// Evaluates a GEMM step for the symbol values and checks it against the
// buffers' element counts (`elements`, indexed by buffer id): sizes are
// non-negative and fit a 32-bit BLAS int, each matrix has a unit row or
// column stride with a leading dimension the library accepts, strides are
// non-negative, C is row-major, and every element any matrix (and the
// epilogue's bias vector, which must be contiguous) may touch lies inside
// its buffer; BGRAD_B and BGRAD_A also need batch 1, alpha 1, beta 0 and a
// row-major B (BGRAD_B) or a column-major A (BGRAD_A), whose bias vector has
// m elements. Errors: INVALID_ARGUMENT "artifact: ..." naming the
// operand and what is wrong. Runtimes call it before every extern call.
absl::StatusOr<GemmDims> EvaluateGemm(const v1::Gemm& gemm,
                                      absl::Span<const int64_t> symbols,
                                      absl::Span<const int64_t> elements);

// A convolution step (artifact.proto, Convolution) for given symbol
// values: x [n, c, *spatial], w [o, c / groups, *kernel], y [n, o, *out].
struct ConvDims {
  int spatial = 0;  // 1..3
  int64_t n = 0, c = 0, o = 0;
  int64_t x[3] = {}, kernel[3] = {}, out[3] = {};
  int64_t stride[3] = {}, padding[3] = {}, dilation[3] = {};
  int64_t groups = 1;
  int64_t x_elements = 0, w_elements = 0, y_elements = 0;
};

// Evaluates a convolution step for the symbol values and checks it against
// the buffers' element counts (`elements`, indexed by buffer id): every
// size is non-negative and fits a 32-bit int, stride and dilation are at
// least 1 and padding at least 0, the groups divide both channel counts,
// the weight has c / groups input channels, y's spatial sizes are those
// the geometry gives for x's, and each buffer holds its tensor. Errors:
// INVALID_ARGUMENT "artifact: ..." saying what is wrong. Runtimes call it
// before every convolution.
absl::StatusOr<ConvDims> EvaluateConv(const v1::Convolution& conv,
                                      absl::Span<const int64_t> symbols,
                                      absl::Span<const int64_t> elements);

// The sizes of an attention step (artifact.proto, Attention).
struct AttentionDims {
  int64_t batch = 0, heads = 0, s_q = 0, s_kv = 0, d_qk = 0, d_v = 0;
};

// Evaluates an attention step for the symbol values and checks it against
// the buffers' element counts (`elements`, indexed by buffer id): every
// size is at least 1 and fits a 32-bit int, and each buffer holds its
// tensor. Errors: INVALID_ARGUMENT "artifact: ..." saying what is wrong.
// Runtimes call it before every attention call.
absl::StatusOr<AttentionDims> EvaluateAttention(
    const v1::Attention& attention, absl::Span<const int64_t> symbols,
    absl::Span<const int64_t> elements);

// The status of a run whose error word (artifact.proto, IndexCheck) is
// `word` = {site + 1, index, size}: OK when word[0] is 0, else OUT_OF_RANGE
// as PyTorch raises an IndexError, naming the node, its op, the index and
// the dim's size:
//   "node 7 (aten.embedding.default): index 50300 is out of range for
//    dimension 0 of size 50257"
//   "node 3 (aten.nll_loss_forward.default): Target 5 is out of bounds
//    (3 classes)"
// A site the program does not have (a corrupt word) is INTERNAL.
absl::Status IndexErrorStatus(const v1::Program& program,
                              const int64_t word[3]);

// Takes the error word a device run left in host memory (`mirror`, written
// asynchronously by a copy from the device, e.g. pinned memory): when
// mirror[0] is set, clears it with a compare-and-swap (of concurrent
// takers one gets the error, the others OK) and returns IndexErrorStatus
// of what it held; OK when it is clear.
absl::Status TakeIndexError(const v1::Program& program, int64_t* mirror);

// Checks `artifact`'s input guards, buffers, output specs and steps: every
// symbol a polynomial uses exists, every dtype is known, each output has
// exactly one buffer of its dtype, temps are allocated before use and freed
// once, launches name a kernel and pass existing buffers, extern calls name
// this runtime's library and a GEMM over existing buffers of its dtype, in
// a dtype pair it takes, that writes neither an input nor an operand; an
// ERROR buffer is unique, INT64 of 3 elements, and present exactly when
// there are index checks.
// Errors: INVALID_ARGUMENT "artifact: ..." naming the buffer, step or
// kernel at fault.
absl::StatusOr<ProgramPlan> PlanProgram(const v1::Artifact& artifact,
                                        const LaunchLimits& limits);

}  // namespace kiln

#endif  // KILN_RUNTIME_PROGRAM_PLAN_H_
