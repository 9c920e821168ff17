#include "runtime/program_plan.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <optional>
#include <string_view>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/guards.h"

namespace kiln {
namespace {

absl::Status CheckPoly(const v1::SymPoly& poly, int num_symbols,
                       absl::string_view what) {
  for (const v1::SymPoly::Term& term : poly.terms()) {
    for (int s : term.symbols()) {
      if (s < 0 || s >= num_symbols) {
        return absl::InvalidArgumentError(absl::StrCat(
            "artifact: ", what, " uses symbol #", s, " of ", num_symbols));
      }
    }
  }
  return absl::OkStatus();
}

// The value of a polynomial without symbols; nothing when it has one.
std::optional<int64_t> ConstantPoly(const v1::SymPoly& poly) {
  int64_t value = 0;
  for (const v1::SymPoly::Term& term : poly.terms()) {
    if (term.symbols_size() > 0) return std::nullopt;
    value += term.coeff();
  }
  return value;
}

const char* LibraryName(v1::ExternCall::Library library) {
  switch (library) {
    case v1::ExternCall::BLAS:
      return "BLAS";
    case v1::ExternCall::CUBLASLT:
      return "cuBLASLt";
    case v1::ExternCall::CUDNN:
      return "cuDNN";
    case v1::ExternCall::ONEDNN:
      return "oneDNN";
    case v1::ExternCall::KILN_RUNTIME:
      return "Kiln's CPU attention";
    default:
      return "no library";
  }
}

// Buffer `b` of an extern call at `where`, passed as `as` (the message's
// "as A", "as the bias") and named `name`, exists, is allocated and has
// the call's `dtype`.
absl::Status CheckExternBuffer(int b, absl::string_view as,
                               absl::string_view name, DType dtype,
                               absl::string_view where, const ProgramPlan& plan,
                               const std::vector<bool>& allocated,
                               const v1::Program& program) {
  const int num_buffers = program.buffers_size();
  if (b < 0 || b >= num_buffers) {
    return absl::InvalidArgumentError(absl::StrCat("artifact: ", where,
                                                   " passes buffer ", b, " of ",
                                                   num_buffers, " as ", as));
  }
  if (plan.temp_slot[b] >= 0 && !allocated[b]) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where, " uses temp buffer ", b,
                     " while it is not allocated"));
  }
  if (DTypeFromWire(program.buffers(b).dtype()) != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where, "'s ", name, " (buffer ", b,
                     ") is not of the call's dtype"));
  }
  return absl::OkStatus();
}

// Checks convolution step `where` against the buffers and the runtime's
// library and dtypes; its sizes are checked at run time (EvaluateConv).
absl::StatusOr<ProgramPlan::Extern> PlanConv(
    const v1::ExternCall& call, const std::string& where, int num_symbols,
    const ProgramPlan& plan, const std::vector<bool>& allocated,
    const LaunchLimits& limits, const v1::Program& program) {
  const v1::Convolution& c = call.conv();
  if (limits.conv_library == v1::ExternCall::LIBRARY_UNSPECIFIED ||
      call.library() != limits.conv_library) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact: ", where, " calls ", LibraryName(call.library()),
        " for a convolution; this runtime calls ",
        LibraryName(limits.conv_library)));
  }
  ProgramPlan::Extern e;
  e.conv = &c;
  const std::optional<DType> dtype = DTypeFromWire(c.dtype());
  const std::optional<DType> result = c.result_dtype() == v1::DTYPE_UNSPECIFIED
                                          ? dtype
                                          : DTypeFromWire(c.result_dtype());
  const bool mixed = dtype && result && *result != *dtype;
  if (!dtype || !result ||
      (!mixed && std::find(limits.conv_dtypes.begin(), limits.conv_dtypes.end(),
                           *dtype) == limits.conv_dtypes.end()) ||
      (mixed && std::find(limits.conv_mixed_dtypes.begin(),
                          limits.conv_mixed_dtypes.end(),
                          std::make_pair(*dtype, *result)) ==
                    limits.conv_mixed_dtypes.end())) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where, " convolves ",
                     dtype ? DTypeName(*dtype) : "an unknown dtype",
                     mixed ? absl::StrCat(" into ", DTypeName(*result)) : "",
                     !result ? " into an unknown dtype" : "", ", which ",
                     LibraryName(limits.conv_library), " does not here"));
  }
  e.dtype = e.compute_dtype = *dtype;
  e.c_dtype = *result;
  if (!v1::Convolution::Direction_IsValid(c.direction())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact: ", where, " has an unknown direction ", c.direction()));
  }
  const int spatial = c.stride_size();
  if (spatial < 1 || spatial > 3 || c.padding_size() != spatial ||
      c.dilation_size() != spatial || c.x_sizes_size() != spatial + 2 ||
      c.w_sizes_size() != spatial + 2 || c.y_sizes_size() != spatial + 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact: ", where,
        " needs 1 to 3 spatial dims with a stride, padding and dilation "
        "each, and x, w and y of 2 more dims"));
  }
  for (const auto* sizes : {&c.x_sizes(), &c.w_sizes(), &c.y_sizes()}) {
    for (const v1::SymPoly& p : *sizes) {
      if (absl::Status s = CheckPoly(p, num_symbols, where); !s.ok()) return s;
    }
  }
  const bool backward_data = c.direction() == v1::Convolution::BACKWARD_DATA;
  const bool backward_filter =
      c.direction() == v1::Convolution::BACKWARD_FILTER;
  const char* names[3] = {backward_data ? "y" : "x",
                          backward_filter ? "y" : "w",
                          backward_data     ? "x"
                          : backward_filter ? "w"
                                            : "y"};
  const int ids[3] = {c.input(), c.weight(), c.output()};
  int* slots[3] = {&e.a, &e.b, &e.c};
  for (int m = 0; m < 3; ++m) {
    if (absl::Status s = CheckExternBuffer(ids[m], names[m], names[m],
                                           m == 2 ? e.c_dtype : *dtype, where,
                                           plan, allocated, program);
        !s.ok())
      return s;
    *slots[m] = ids[m];
  }
  if (program.buffers(e.c).kind() == v1::BufferSpec::INPUT || e.c == e.a ||
      e.c == e.b) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where, " writes buffer ", e.c,
                     ", which is an input or an operand of the call"));
  }
  return e;
}

// Checks attention step `where` against the buffers and the runtime; its
// sizes are checked at run time (EvaluateAttention).
absl::StatusOr<ProgramPlan::Extern> PlanAttention(
    const v1::ExternCall& call, const std::string& where, int num_symbols,
    const ProgramPlan& plan, const std::vector<bool>& allocated,
    const LaunchLimits& limits, const v1::Program& program) {
  const v1::Attention& a = call.attention();
  if (limits.attention_library == v1::ExternCall::LIBRARY_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact: ", where, " calls ", LibraryName(call.library()),
        " for fused attention, which this runtime does not run"));
  }
  if (call.library() != limits.attention_library) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact: ", where, " calls ", LibraryName(call.library()),
        " for fused attention; this runtime calls ",
        LibraryName(limits.attention_library)));
  }
  if (!v1::Attention::Direction_IsValid(a.direction())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact: ", where, " has an unknown direction ", a.direction()));
  }
  const bool forward = a.direction() == v1::Attention::FORWARD;
  const std::optional<DType> dtype = DTypeFromWire(a.dtype());
  if (!dtype || !absl::c_linear_search(limits.attention_dtypes, *dtype)) {
    std::vector<std::string> names;
    for (DType d : limits.attention_dtypes) names.emplace_back(DTypeName(d));
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where, " attends in ",
                     dtype ? DTypeName(*dtype) : "an unknown dtype", " (",
                     absl::StrJoin(names, ", "), " only)"));
  }
  if (!(a.dropout() >= 0 && a.dropout() < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where, " has dropout ", a.dropout(),
                     " (0 <= dropout < 1 allowed)"));
  }
  if (a.bias_grad() && (forward || !a.bias())) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where,
                     " asks for the bias's gradient, which only a backward "
                     "with a bias gives"));
  }
  if (a.bias_grad() && !limits.attention_bias_grad) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact: ", where,
        " asks for the bias's gradient, which this runtime's attention "
        "does not give"));
  }
  std::vector<const char*> names = {"q", "k", "v"};
  if (a.bias()) names.push_back("bias");
  if (!forward) names.insert(names.end(), {"out", "lse", "grad_out"});
  if (a.dropout() > 0) names.push_back("rng");
  std::vector<const char*> writes =
      forward ? std::vector<const char*>{"out", "lse"}
              : std::vector<const char*>{"grad_q", "grad_k", "grad_v"};
  if (a.bias_grad()) writes.push_back("grad_bias");
  names.insert(names.end(), writes.begin(), writes.end());
  const int count = static_cast<int>(names.size());
  const int reads = count - static_cast<int>(writes.size());
  if (a.buffers_size() != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where, " passes ", a.buffers_size(),
                     " buffers to attention; it takes ", count));
  }
  for (const v1::SymPoly* p :
       {&a.batch(), &a.heads(), &a.s_q(), &a.s_kv(), &a.d_qk(), &a.d_v()}) {
    if (absl::Status s = CheckPoly(*p, num_symbols, where); !s.ok()) return s;
  }
  ProgramPlan::Extern e;
  e.attention = &a;
  e.dtype = e.compute_dtype = e.c_dtype = *dtype;
  for (int m = 0; m < count; ++m) {
    const char* name = names[m];
    const DType want = std::string_view(name) == "lse"   ? DType::kFloat32
                       : std::string_view(name) == "rng" ? DType::kInt64
                                                         : *dtype;
    const int b = a.buffers(m);
    if (absl::Status s = CheckExternBuffer(b, name, name, want, where, plan,
                                           allocated, program);
        !s.ok())
      return s;
    if (m < reads) continue;
    // A written tensor is no input, and no other tensor of the call.
    bool aliased = program.buffers(b).kind() == v1::BufferSpec::INPUT;
    for (int o = 0; o < count; ++o) aliased |= o != m && a.buffers(o) == b;
    if (aliased) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: ", where, " writes ", name, " to buffer ", b,
                       ", which is an input or another tensor of the call"));
    }
  }
  return e;
}

// Checks extern call step `i` against the buffers (kinds, dtypes,
// allocation state) and the runtime's library and dtypes.
absl::StatusOr<ProgramPlan::Extern> PlanExtern(
    const v1::ExternCall& call, int i, int num_symbols, const ProgramPlan& plan,
    const std::vector<bool>& allocated, const LaunchLimits& limits,
    const v1::Program& program) {
  const std::string where = absl::StrCat("step ", i, " (extern call)");
  if (call.has_conv()) {
    return PlanConv(call, where, num_symbols, plan, allocated, limits, program);
  }
  if (call.has_attention()) {
    return PlanAttention(call, where, num_symbols, plan, allocated, limits,
                         program);
  }
  if (limits.extern_library == v1::ExternCall::LIBRARY_UNSPECIFIED ||
      call.library() != limits.extern_library) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact: ", where, " calls ", LibraryName(call.library()),
        "; this runtime calls ", LibraryName(limits.extern_library)));
  }
  if (!call.has_gemm()) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where, " names no operation"));
  }
  const v1::Gemm& g = call.gemm();
  ProgramPlan::Extern e;
  e.gemm = &g;
  const std::optional<DType> dtype = DTypeFromWire(g.dtype());
  const std::optional<DType> compute = DTypeFromWire(g.compute_dtype());
  if (!dtype || !compute) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where, " has an unknown dtype"));
  }
  e.dtype = *dtype;
  e.compute_dtype = *compute;
  e.c_dtype = *dtype;
  if (g.c_dtype() != v1::DTYPE_UNSPECIFIED) {
    const std::optional<DType> c_dtype = DTypeFromWire(g.c_dtype());
    if (!c_dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: ", where, " has an unknown dtype for C"));
    }
    if (*c_dtype != *dtype && std::find(limits.gemm_mixed_dtypes.begin(),
                                        limits.gemm_mixed_dtypes.end(),
                                        std::make_pair(*dtype, *c_dtype)) ==
                                  limits.gemm_mixed_dtypes.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: ", where, " multiplies ", DTypeName(*dtype),
                       " into a ", DTypeName(*c_dtype), " C, which ",
                       LibraryName(limits.extern_library), " does not here"));
    }
    e.c_dtype = *c_dtype;
  }
  if (e.c_dtype == *dtype &&
      std::find(limits.gemm_dtypes.begin(), limits.gemm_dtypes.end(),
                std::make_pair(*dtype, *compute)) == limits.gemm_dtypes.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where, " multiplies ", DTypeName(*dtype),
                     " computing in ", DTypeName(*compute), ", which ",
                     LibraryName(limits.extern_library), " does not here"));
  }
  if (e.c_dtype != *dtype && *compute != DType::kFloat32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact: ", where, " computes a ", DTypeName(*dtype), " product in ",
        DTypeName(*compute), "; into another C only in float32"));
  }
  if (!std::isfinite(g.alpha()) || !std::isfinite(g.beta())) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where, " has a non-finite alpha or beta"));
  }
  const v1::MatrixOperand* operands[3] = {&g.a(), &g.b(), &g.c()};
  int* ids[3] = {&e.a, &e.b, &e.c};
  const char* names[3] = {"A", "B", "C"};
  auto check_buffer = [&](int b, absl::string_view as,
                          absl::string_view name) -> absl::Status {
    return CheckExternBuffer(b, as, name, *dtype, where, plan, allocated,
                             program);
  };
  for (int m = 0; m < 3; ++m) {
    const v1::MatrixOperand& op = *operands[m];
    const int b = op.buffer();
    if (absl::Status s = CheckExternBuffer(b, names[m], names[m],
                                           m == 2 ? e.c_dtype : *dtype, where,
                                           plan, allocated, program);
        !s.ok()) {
      return s;
    }
    for (const v1::SymPoly* p : {&op.offset(), &op.batch_stride(),
                                 &op.row_stride(), &op.col_stride()}) {
      if (absl::Status s = CheckPoly(*p, num_symbols, where); !s.ok()) return s;
    }
    *ids[m] = b;
  }
  for (const v1::SymPoly* p : {&g.batch(), &g.m(), &g.n(), &g.k()}) {
    if (absl::Status s = CheckPoly(*p, num_symbols, where); !s.ok()) return s;
  }
  if (g.epilogue() != v1::Gemm::EPILOGUE_NONE || g.tf32() ||
      g.strict_reduction()) {
    if (!limits.gemm_epilogues) {
      return absl::InvalidArgumentError(absl::StrCat(
          "artifact: ", where, " asks ", LibraryName(call.library()),
          " for an epilogue, TF32 or a strict reduction, which this runtime "
          "does not apply"));
    }
    if (!v1::Gemm::Epilogue_IsValid(g.epilogue())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "artifact: ", where, " has an unknown epilogue ", g.epilogue()));
    }
  }
  const bool has_bias = GemmEpilogueHasBias(g.epilogue());
  if (has_bias != g.has_bias()) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where,
                     has_bias ? " has a bias epilogue without a bias"
                              : " has a bias without a bias epilogue"));
  }
  if (has_bias) {
    const int b = g.bias().buffer();
    if (absl::Status s = check_buffer(b, "the bias", "bias"); !s.ok()) return s;
    for (const v1::SymPoly* p : {&g.bias().offset(), &g.bias().col_stride()}) {
      if (absl::Status s = CheckPoly(*p, num_symbols, where); !s.ok()) return s;
    }
    e.bias = b;
  }
  if (program.buffers(e.c).kind() == v1::BufferSpec::INPUT || e.c == e.a ||
      e.c == e.b || e.c == e.bias) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: ", where, " writes buffer ", e.c,
                     ", which is an input or an operand of the call"));
  }
  if (GemmEpilogueWritesBias(g.epilogue()) &&
      (program.buffers(e.bias).kind() == v1::BufferSpec::INPUT ||
       e.bias == e.a || e.bias == e.b)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact: ", where, " writes its bias gradient to buffer ", e.bias,
        ", which is an input or an operand of the call"));
  }
  return e;
}

// A matrix of `rows` x `cols` with the given strides, as a library takes it:
// row-major where the strides allow, else column-major (transposed), or
// column-major first with `prefer_transposed` (a BGRAD_A operand over k = 1,
// whose single column either reading fits).
absl::StatusOr<GemmMatrix> ResolveMatrix(const char* name, int64_t offset,
                                         int64_t batch_stride,
                                         int64_t row_stride, int64_t col_stride,
                                         int64_t rows, int64_t cols,
                                         bool prefer_transposed = false) {
  if (offset < 0 || batch_stride < 0 || row_stride < 0 || col_stride < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "artifact: GEMM operand ", name, " has a negative offset or stride"));
  }
  GemmMatrix m;
  m.offset = offset;
  m.batch_stride = batch_stride;
  const int64_t min_row_ld = std::max<int64_t>(1, cols);
  const int64_t min_col_ld = std::max<int64_t>(1, rows);
  if (rows == 0 || cols == 0) {  // nothing is read or written
    m.ld = min_row_ld;
    return m;
  }
  // The stride of a dim of one element is never used: any will do.
  auto row_major = [&]() -> bool {
    if (!(col_stride == 1 || cols <= 1)) return false;
    m.transposed = false;
    m.ld = rows <= 1 ? std::max(min_row_ld, row_stride) : row_stride;
    return m.ld >= min_row_ld;
  };
  auto column_major = [&]() -> bool {  // a transpose
    if (!(row_stride == 1 || rows <= 1)) return false;
    m.transposed = true;
    m.ld = cols <= 1 ? std::max(min_col_ld, col_stride) : col_stride;
    return m.ld >= min_col_ld;
  };
  if (prefer_transposed ? column_major() || row_major()
                        : row_major() || column_major()) {
    return m;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "artifact: GEMM operand ", name, " of ", rows, "x", cols,
      " has strides (", row_stride, ", ", col_stride,
      "): a library needs a unit stride and a leading dimension covering "
      "the other"));
}

}  // namespace

absl::Status TakeIndexError(const v1::Program& program, int64_t* mirror) {
  std::atomic_ref<int64_t> site(mirror[0]);
  int64_t word[3] = {site.load(std::memory_order_acquire), 0, 0};
  if (word[0] == 0) return absl::OkStatus();
  word[1] = std::atomic_ref<int64_t>(mirror[1]).load(std::memory_order_relaxed);
  word[2] = std::atomic_ref<int64_t>(mirror[2]).load(std::memory_order_relaxed);
  int64_t expected = word[0];
  if (!site.compare_exchange_strong(expected, 0, std::memory_order_acq_rel)) {
    return absl::OkStatus();  // another caller took it
  }
  return IndexErrorStatus(program, word);
}

absl::Status IndexErrorStatus(const v1::Program& program,
                              const int64_t word[3]) {
  const int64_t site_plus_one = word[0], index = word[1], size = word[2];
  if (site_plus_one == 0) return absl::OkStatus();
  if (site_plus_one < 0 || site_plus_one > program.index_checks_size()) {
    return absl::InternalError(absl::StrCat("the error word names index check ",
                                            site_plus_one - 1, " of ",
                                            program.index_checks_size()));
  }
  const v1::IndexCheck& c = program.index_checks(site_plus_one - 1);
  const std::string where = absl::StrCat("node ", c.node(), " (", c.op(), ")");
  if (c.kind() == v1::IndexCheck::TARGET) {
    return absl::OutOfRangeError(absl::StrCat(
        where, ": Target ", index, " is out of bounds (", size, " classes)"));
  }
  return absl::OutOfRangeError(absl::StrCat(where, ": index ", index,
                                            " is out of range for dimension ",
                                            c.dim(), " of size ", size));
}

absl::StatusOr<ConvDims> EvaluateConv(const v1::Convolution& conv,
                                      absl::Span<const int64_t> symbols,
                                      absl::Span<const int64_t> elements) {
  ConvDims d;
  d.spatial = conv.stride_size();
  d.groups = conv.groups();
  auto fail = [](auto&&... what) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: convolution ", what...));
  };
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  int64_t x[5], w[5], y[5];
  const struct {
    const char* name;
    const google::protobuf::RepeatedPtrField<v1::SymPoly>* sizes;
    int64_t* out;
    int64_t* count;
  } tensors[3] = {{"x", &conv.x_sizes(), x, &d.x_elements},
                  {"w", &conv.w_sizes(), w, &d.w_elements},
                  {"y", &conv.y_sizes(), y, &d.y_elements}};
  for (const auto& t : tensors) {
    int64_t count = 1;
    for (int i = 0; i < d.spatial + 2; ++i) {
      const int64_t v = EvaluateSymPoly(t.sizes->Get(i), symbols);
      if (v < 0 || v > kMaxInt) {
        return fail(t.name, " dim ", i, " has size ", v,
                    " (0 to 2^31 - 1 allowed)");
      }
      t.out[i] = v;
      // Saturates instead of overflowing: the buffer check below fails.
      count = v != 0 && count > kMaxInt * kMaxInt / v ? kMaxInt * kMaxInt
                                                      : count * v;
    }
    *t.count = count;
  }
  d.n = x[0];
  d.c = x[1];
  d.o = w[0];
  if (d.groups < 1 || d.c % d.groups != 0 || d.o % d.groups != 0 ||
      w[1] * d.groups != d.c || y[0] != d.n || y[1] != d.o) {
    return fail("of x [", x[0], ", ", x[1], ", ...], w [", w[0], ", ", w[1],
                ", ...] and y [", y[0], ", ", y[1], ", ...] in ", d.groups,
                " groups has inconsistent channels");
  }
  for (int s = 0; s < d.spatial; ++s) {
    d.x[s] = x[2 + s];
    d.kernel[s] = w[2 + s];
    d.out[s] = y[2 + s];
    d.stride[s] = conv.stride(s);
    d.padding[s] = conv.padding(s);
    d.dilation[s] = conv.dilation(s);
    if (d.stride[s] < 1 || d.dilation[s] < 1 || d.padding[s] < 0 ||
        d.stride[s] > kMaxInt || d.dilation[s] > kMaxInt ||
        d.padding[s] > kMaxInt) {
      return fail("spatial dim ", s, " has stride ", d.stride[s], ", padding ",
                  d.padding[s], ", dilation ", d.dilation[s]);
    }
    const int64_t span = d.dilation[s] * (d.kernel[s] - 1) + 1;
    const int64_t room = d.x[s] + 2 * d.padding[s] - span;
    const int64_t expect = room < 0 ? 0 : room / d.stride[s] + 1;
    if (d.kernel[s] < 1 || room < 0 || d.out[s] != expect) {
      return fail("spatial dim ", s, ": x has ", d.x[s], ", the kernel ",
                  d.kernel[s], " and y ", d.out[s], " positions, which stride ",
                  d.stride[s], ", padding ", d.padding[s], " and dilation ",
                  d.dilation[s], " do not give");
    }
  }
  const int ids[3] = {conv.input(), conv.weight(), conv.output()};
  const bool backward_data = conv.direction() == v1::Convolution::BACKWARD_DATA;
  const bool backward_filter =
      conv.direction() == v1::Convolution::BACKWARD_FILTER;
  const int64_t needs[3] = {backward_data ? d.y_elements : d.x_elements,
                            backward_filter ? d.y_elements : d.w_elements,
                            backward_data     ? d.x_elements
                            : backward_filter ? d.w_elements
                                              : d.y_elements};
  for (int m = 0; m < 3; ++m) {
    if (elements[ids[m]] < needs[m]) {
      return fail("needs ", needs[m], " elements of buffer ", ids[m],
                  ", which has ", elements[ids[m]]);
    }
  }
  return d;
}

absl::StatusOr<AttentionDims> EvaluateAttention(
    const v1::Attention& a, absl::Span<const int64_t> symbols,
    absl::Span<const int64_t> elements) {
  constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  AttentionDims d;
  const struct {
    const char* name;
    const v1::SymPoly* poly;
    int64_t* out;
  } sizes[] = {
      {"batch", &a.batch(), &d.batch},  {"heads", &a.heads(), &d.heads},
      {"queries", &a.s_q(), &d.s_q},    {"keys", &a.s_kv(), &d.s_kv},
      {"head dim", &a.d_qk(), &d.d_qk}, {"value dim", &a.d_v(), &d.d_v}};
  for (const auto& s : sizes) {
    *s.out = EvaluateSymPoly(*s.poly, symbols);
    if (*s.out < 1 || *s.out > kMaxInt) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: attention's ", s.name, " is ", *s.out,
                       " (1 to 2^31 - 1 allowed)"));
    }
  }
  // Element counts (saturating: a huge one fails the buffer check).
  auto count = [&](std::initializer_list<int64_t> dims) {
    double c = 1;
    for (int64_t v : dims) c *= static_cast<double>(v);
    return c > 9e18 ? std::numeric_limits<int64_t>::max()
                    : static_cast<int64_t>(c);
  };
  const int64_t q = count({d.batch, d.heads, d.s_q, d.d_qk});
  const int64_t k = count({d.batch, d.heads, d.s_kv, d.d_qk});
  const int64_t v = count({d.batch, d.heads, d.s_kv, d.d_v});
  const int64_t o = count({d.batch, d.heads, d.s_q, d.d_v});
  const int64_t lse = count({d.batch, d.heads, d.s_q});
  std::vector<int64_t> needs = {q, k, v};
  const int64_t bias = count({a.bias_batch() ? d.batch : 1,
                              a.bias_heads() ? d.heads : 1, d.s_q, d.s_kv});
  if (a.bias()) needs.push_back(bias);
  const bool forward = a.direction() == v1::Attention::FORWARD;
  if (!forward) needs.insert(needs.end(), {o, lse, o});
  if (a.dropout() > 0) needs.push_back(2);  // rng: (seed, offset)
  if (forward) {
    needs.insert(needs.end(), {o, lse});
  } else {
    needs.insert(needs.end(), {q, k, v});
    if (a.bias_grad()) needs.push_back(bias);
  }
  for (size_t m = 0;
       m < needs.size() && m < static_cast<size_t>(a.buffers_size()); ++m) {
    const int b = a.buffers(static_cast<int>(m));
    if (elements[b] < needs[m]) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: attention needs ", needs[m],
                       " elements of buffer ", b, ", which has ", elements[b]));
    }
  }
  return d;
}

bool GemmEpilogueHasBias(v1::Gemm::Epilogue epilogue) {
  return epilogue == v1::Gemm::BIAS || epilogue == v1::Gemm::RELU_BIAS ||
         epilogue == v1::Gemm::GELU_TANH_BIAS ||
         GemmEpilogueWritesBias(epilogue);
}

bool GemmEpilogueWritesBias(v1::Gemm::Epilogue epilogue) {
  return epilogue == v1::Gemm::BGRAD_B || epilogue == v1::Gemm::BGRAD_A;
}

absl::StatusOr<GemmDims> EvaluateGemm(const v1::Gemm& gemm,
                                      absl::Span<const int64_t> symbols,
                                      absl::Span<const int64_t> elements) {
  GemmDims d;
  d.batch = EvaluateSymPoly(gemm.batch(), symbols);
  d.m = EvaluateSymPoly(gemm.m(), symbols);
  d.n = EvaluateSymPoly(gemm.n(), symbols);
  d.k = EvaluateSymPoly(gemm.k(), symbols);
  constexpr int64_t kMaxInt = 2147483647;
  for (int64_t v : {d.batch, d.m, d.n, d.k}) {
    if (v < 0 || v > kMaxInt) {
      return absl::InvalidArgumentError(absl::StrCat(
          "artifact: GEMM size ", v, " is negative or exceeds 2^31-1"));
    }
  }
  struct Operand {
    const char* name;
    const v1::MatrixOperand* op;
    int64_t rows, cols;
    GemmMatrix* out;
  };
  const Operand operands[3] = {{"A", &gemm.a(), d.m, d.k, &d.a},
                               {"B", &gemm.b(), d.k, d.n, &d.b},
                               {"C", &gemm.c(), d.m, d.n, &d.c}};
  for (const Operand& o : operands) {
    const int64_t row_stride = EvaluateSymPoly(o.op->row_stride(), symbols);
    const int64_t col_stride = EvaluateSymPoly(o.op->col_stride(), symbols);
    auto m = ResolveMatrix(
        o.name, EvaluateSymPoly(o.op->offset(), symbols),
        EvaluateSymPoly(o.op->batch_stride(), symbols), row_stride, col_stride,
        o.rows, o.cols, o.out == &d.a && gemm.epilogue() == v1::Gemm::BGRAD_A);
    if (!m.ok()) return m.status();
    *o.out = *m;
    if (d.batch == 0 || o.rows == 0 || o.cols == 0) continue;
    // The last element the matrix may touch (strides are non-negative).
    const __int128 last = static_cast<__int128>(m->offset) +
                          static_cast<__int128>(d.batch - 1) * m->batch_stride +
                          static_cast<__int128>(o.rows - 1) * row_stride +
                          static_cast<__int128>(o.cols - 1) * col_stride;
    if (last >= elements[o.op->buffer()]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "artifact: GEMM operand ", o.name, " reaches past the end of buffer ",
          o.op->buffer(), " (", elements[o.op->buffer()], " elements)"));
    }
  }
  if (d.c.transposed && d.m > 1 && d.n > 1) {
    return absl::InvalidArgumentError(
        "artifact: GEMM output C is not row-major");
  }
  const bool bgrad_a = gemm.epilogue() == v1::Gemm::BGRAD_A;
  if (GemmEpilogueWritesBias(gemm.epilogue()) &&
      (d.batch != 1 || gemm.alpha() != 1 || gemm.beta() != 0 ||
       (bgrad_a ? !d.a.transposed : d.b.transposed))) {
    return absl::InvalidArgumentError(
        "artifact: a GEMM's bias gradient (BGRAD_B, BGRAD_A) needs batch 1, "
        "alpha 1, beta 0 and a row-major B (BGRAD_B) or a column-major A "
        "(BGRAD_A)");
  }
  if (gemm.has_bias()) {
    d.bias_offset = EvaluateSymPoly(gemm.bias().offset(), symbols);
    const int64_t stride = EvaluateSymPoly(gemm.bias().col_stride(), symbols);
    const int64_t length = bgrad_a ? d.m : d.n;
    if (length > 1 && stride != 1) {
      return absl::InvalidArgumentError(
          "artifact: the GEMM's bias vector is not contiguous");
    }
    if (d.bias_offset < 0 ||
        (length > 0 && static_cast<__int128>(d.bias_offset) + length - 1 >=
                           elements[gemm.bias().buffer()])) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: the GEMM's bias reaches outside buffer ",
                       gemm.bias().buffer(), " (",
                       elements[gemm.bias().buffer()], " elements)"));
    }
  }
  return d;
}

absl::StatusOr<ProgramPlan> PlanProgram(const v1::Artifact& artifact,
                                        const LaunchLimits& limits) {
  ProgramPlan out;
  const v1::Program& program = artifact.program();
  const int num_symbols = artifact.symbols_size();
  const int num_buffers = program.buffers_size();
  out.element_size.assign(num_buffers, 0);
  out.temp_slot.assign(num_buffers, -1);
  out.arena_offset.assign(num_buffers, -1);
  out.outputs.assign(artifact.outputs_size(), ProgramPlan::Output{});
  std::vector<bool> output_seen(artifact.outputs_size(), false);

  for (int i = 0; i < artifact.inputs_size(); ++i) {
    const v1::InputGuard& g = artifact.inputs(i);
    for (const v1::SymPoly& p : g.sizes()) {
      if (absl::Status s = CheckPoly(p, num_symbols, "an input size");
          !s.ok()) {
        return s;
      }
    }
    for (const v1::SymPoly& p : g.strides()) {
      if (absl::Status s = CheckPoly(p, num_symbols, "an input stride");
          !s.ok()) {
        return s;
      }
    }
    if (g.strides_size() != g.sizes_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: input ", i, " guards ", g.sizes_size(),
                       " sizes and ", g.strides_size(), " strides"));
    }
  }

  for (int b = 0; b < num_buffers; ++b) {
    const v1::BufferSpec& spec = program.buffers(b);
    const std::optional<DType> dtype = DTypeFromWire(spec.dtype());
    if (!dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "artifact: buffer ", b, " has unknown dtype #", spec.dtype()));
    }
    out.element_size[b] = DTypeSize(*dtype);
    if (absl::Status s = CheckPoly(spec.elements(), num_symbols,
                                   absl::StrCat("buffer ", b, "'s size"));
        !s.ok()) {
      return s;
    }
    switch (spec.kind()) {
      case v1::BufferSpec::INPUT:
        if (spec.index() < 0 || spec.index() >= artifact.inputs_size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("artifact: buffer ", b, " is input ", spec.index(),
                           " of ", artifact.inputs_size()));
        }
        out.input_buffers.emplace_back(b, spec.index());
        break;
      case v1::BufferSpec::OUTPUT: {
        const int o = spec.index();
        if (o < 0 || o >= artifact.outputs_size() ||
            artifact.outputs(o).buffer() != b || output_seen[o]) {
          return absl::InvalidArgumentError(
              absl::StrCat("artifact: buffer ", b, " claims to be output ", o,
                           ", which the output specs do not give that buffer"));
        }
        output_seen[o] = true;
        const v1::OutputSpec& output = artifact.outputs(o);
        const std::optional<DType> out_dtype = DTypeFromWire(output.dtype());
        if (!out_dtype || *out_dtype != *dtype) {
          return absl::InvalidArgumentError(absl::StrCat(
              "artifact: output ", o, "'s dtype differs from its buffer's"));
        }
        for (const v1::SymPoly& p : output.sizes()) {
          if (absl::Status s = CheckPoly(p, num_symbols, "an output size");
              !s.ok()) {
            return s;
          }
        }
        out.outputs[o] =
            ProgramPlan::Output{b, *dtype, &output, &spec.elements()};
        break;
      }
      case v1::BufferSpec::TEMP: {
        out.temp_slot[b] = out.num_temps++;
        const std::optional<int64_t> n = ConstantPoly(spec.elements());
        if (limits.arena_temp_bytes > 0 && n && *n >= 0 &&
            *n <= limits.arena_temp_bytes / out.element_size[b]) {
          // 256 bytes apart, as the allocators' own blocks are aligned.
          out.arena_offset[b] = out.arena_bytes;
          out.arena_bytes += (*n * out.element_size[b] + 255) / 256 * 256;
        }
        break;
      }
      case v1::BufferSpec::ERROR: {
        const std::optional<int64_t> n = ConstantPoly(spec.elements());
        if (out.error_buffer >= 0 || *dtype != DType::kInt64 || n != 3) {
          return absl::InvalidArgumentError(absl::StrCat(
              "artifact: buffer ", b,
              " is a second error word or not an int64 word of 3 elements"));
        }
        out.error_buffer = b;
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("artifact: buffer ", b, " has no kind"));
    }
  }
  if ((out.error_buffer >= 0) != (program.index_checks_size() > 0)) {
    return absl::InvalidArgumentError(
        "artifact: index checks without an error word, or the reverse");
  }
  for (int o = 0; o < artifact.outputs_size(); ++o) {
    if (!output_seen[o]) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: no buffer holds output ", o));
    }
  }
  // Input writes: each names an input, at most once, and a graph output
  // that is not among the artifact's outputs (at most once).
  absl::flat_hash_set<int> written_inputs, written_outputs;
  for (const v1::InputWrite& w : artifact.input_writes()) {
    if (w.input() < 0 || w.input() >= artifact.inputs_size() ||
        !written_inputs.insert(w.input()).second || w.output() < 0 ||
        w.output() >= artifact.outputs_size() + artifact.input_writes_size() ||
        !written_outputs.insert(w.output()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: input write of output ", w.output(),
                       " into input ", w.input(), " is malformed"));
    }
  }

  // Walk the steps as Run will, so that a launch never sees a temp that is
  // not allocated.
  std::vector<bool> allocated(num_buffers, false);
  for (int i = 0; i < program.steps_size(); ++i) {
    const v1::Step& step = program.steps(i);
    if (step.has_alloc() || step.has_free()) {
      const int b = step.has_alloc() ? step.alloc() : step.free();
      if (b < 0 || b >= num_buffers || out.temp_slot[b] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("artifact: step ", i, " allocates or frees buffer ", b,
                         ", which is not a temp"));
      }
      if (allocated[b] == step.has_alloc()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "artifact: step ", i, (step.has_alloc() ? " allocates" : " frees"),
            " buffer ", b,
            step.has_alloc() ? " twice" : " before allocating it"));
      }
      allocated[b] = step.has_alloc();
      if (out.arena_offset[b] >= 0) continue;  // in the arena, all run long
      out.steps.push_back(
          ProgramPlan::Step{step.has_alloc() ? ProgramPlan::Step::Kind::kAlloc
                                             : ProgramPlan::Step::Kind::kFree,
                            b});
      continue;
    }
    if (step.has_call()) {
      auto e = PlanExtern(step.call(), i, num_symbols, out, allocated, limits,
                          program);
      if (!e.ok()) return e.status();
      out.steps.push_back(
          ProgramPlan::Step{ProgramPlan::Step::Kind::kExtern,
                            static_cast<int>(out.externs.size())});
      out.externs.push_back(*e);
      continue;
    }
    if (!step.has_launch()) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: step ", i, " is empty"));
    }
    const v1::Launch& l = step.launch();
    const std::string where =
        absl::StrCat("step ", i, " (kernel '", l.kernel(), "')");
    if (l.kernel().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: step ", i, " launches no kernel"));
    }
    if (limits.max_block_threads > 0 &&
        (l.block_threads() < 1 ||
         l.block_threads() > limits.max_block_threads ||
         l.items_per_block() < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "artifact: ", where, " has block_threads ", l.block_threads(),
          " and items_per_block ", l.items_per_block()));
    }
    if (limits.max_kernel_params > 0 &&
        l.buffers_size() + num_symbols > limits.max_kernel_params) {
      return absl::InvalidArgumentError(absl::StrCat(
          "artifact: ", where, " takes ", l.buffers_size() + num_symbols,
          " parameters, more than a launch can pass"));
    }
    if (absl::Status s = CheckPoly(l.range(), num_symbols, where + "'s range");
        !s.ok()) {
      return s;
    }
    ProgramPlan::Launch plan;
    plan.kernel = &l.kernel();
    plan.range = &l.range();
    plan.items_per_block = l.items_per_block();
    plan.block_threads = static_cast<unsigned>(l.block_threads());
    plan.grain = std::max<int64_t>(l.grain(), 1);
    plan.first_slot = static_cast<int>(out.launch_slots.size());
    plan.num_slots = l.buffers_size();
    for (int b : l.buffers()) {
      if (b < 0 || b >= num_buffers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "artifact: ", where, " passes buffer ", b, " of ", num_buffers));
      }
      if (out.temp_slot[b] >= 0 && !allocated[b]) {
        return absl::InvalidArgumentError(
            absl::StrCat("artifact: ", where, " uses temp buffer ", b,
                         " while it is not allocated"));
      }
      out.launch_slots.push_back(b);
    }
    out.max_params = std::max(out.max_params, l.buffers_size() + num_symbols);
    out.steps.push_back(
        ProgramPlan::Step{ProgramPlan::Step::Kind::kLaunch,
                          static_cast<int>(out.launches.size())});
    out.launches.push_back(plan);
  }
  return out;
}

}  // namespace kiln
