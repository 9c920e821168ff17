#include "runtime/cpu_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "graph/dtype.h"
#include "runtime/cpu_blas.h"
#include "support/half.h"
#include "support/philox.h"

namespace kiln {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Tile sizes, ATen's CPU flash attention's: a block of queries against
// keys kKeyBlock at a time.
constexpr int kKeyBlock = 512;
int QueryBlock(int64_t l) { return l >= 768 ? 256 : l >= 192 ? 64 : 32; }

// ---- Row kernels --------------------------------------------------------
// Written with GCC's vector extensions, kLanes floats at a time, and
// compiled for each x86-64 level the CPU may have (target_clones; the
// loader picks one when the library loads): the runtime is built for
// baseline x86-64 and the rows are where attention's time goes outside
// the products.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_ROW_KERNEL \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KILN_ROW_KERNEL
#endif
#define KILN_ALWAYS_INLINE __attribute__((always_inline)) inline
// Vectors are passed between the inlined helpers only: no ABI to keep.
#pragma GCC diagnostic ignored "-Wpsabi"

constexpr int kLanes = 16;
typedef float VF __attribute__((vector_size(kLanes * 4)));
typedef int32_t VI __attribute__((vector_size(kLanes * 4)));

KILN_ALWAYS_INLINE VF Broadcast(float x) { return VF{} + x; }
KILN_ALWAYS_INLINE VF Load(const float* p) {
  VF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
KILN_ALWAYS_INLINE void Store(float* p, VF v) { std::memcpy(p, &v, sizeof v); }
// p's first n < kLanes values, the other lanes `fill`.
KILN_ALWAYS_INLINE VF LoadPart(const float* p, int n, float fill) {
  VF v = Broadcast(fill);
  for (int i = 0; i < n; ++i) v[i] = p[i];
  return v;
}
KILN_ALWAYS_INLINE void StorePart(float* p, VF v, int n) {
  for (int i = 0; i < n; ++i) p[i] = v[i];
}
// Lanes of a where `mask` (a comparison's -1/0 lanes), else of b.
KILN_ALWAYS_INLINE VF Select(VI mask, VF a, VF b) {
  return (VF)((mask & (VI)a) | (~mask & (VI)b));
}

// exp(x) as the CPU code generator's inline exp computes it
// (compiler/codegen_cpu.cc, KernelEmitter::Exp: SLEEF's expf_u10, within
// 1 ulp): x = q ln2 + s with ln 2 in two parts, e^s by a polynomial, times
// 2^q in two factors so that subnormal results round once; 0 and inf
// beyond +-104, NaN kept. The rounding of x / ln 2 to an integer adds and
// subtracts 1.5 * 2^23 (exact for |x / ln 2| < 2^22, round to nearest
// even).
KILN_ALWAYS_INLINE VF Exp(VF x) {
  const VI bits = (VI)x;
  const VI magnitude = bits & 0x7fffffff;
  const VI nan = magnitude > 0x7f800000;
  const VI big = magnitude > 0x42d00000;  // 104
  const VF xc = Select(big, VF{}, x);
  const VF shift = Broadcast(12582912.0f);
  const VF qf = (xc * 1.442695040888963407359924681f + shift) - shift;
  VF s = qf * -0.693145751953125f + xc;
  s = qf * -1.428606765330187045e-06f + s;
  VF u = Broadcast(0.000198527617612853646278381f);
  u = u * s + 0.00139304355252534151077271f;
  u = u * s + 0.00833336077630519866943359f;
  u = u * s + 0.0416664853692054748535156f;
  u = u * s + 0.166666671633720397949219f;
  u = u * s + 0.5f;
  u = 1.0f + ((s * s) * u + s);
  const VI q = __builtin_convertvector(qf, VI);
  const VI q_half = q >> 1;
  u = u * (VF)((q_half + 127) << 23) * (VF)((q - q_half + 127) << 23);
  const VF limit = Select(bits < 0, VF{}, Broadcast(kInf));
  return Select(nan, x, Select(big, limit, u));
}

// float32 values rounded to bfloat16 (to nearest even; NaN stays NaN), as
// float32.
KILN_ALWAYS_INLINE VF RoundBf16(VF x) {
  const VI u = (VI)x;
  const VI rounded = (u + 0x7fff + ((u >> 16) & 1)) & ~0xffff;
  return Select((u & 0x7fffffff) > 0x7f800000, x, (VF)rounded);
}

// The largest of x[0, n) (-inf for none; NaN lanes are passed over, and
// reach the result through exp).
KILN_ROW_KERNEL float RowMax(const float* x, int n) {
  VF m = Broadcast(-kInf);
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const VF v = Load(x + j);
    m = Select(v > m, v, m);
  }
  if (j < n) {
    const VF v = LoadPart(x + j, n - j, -kInf);
    m = Select(v > m, v, m);
  }
  float r = -kInf;
  for (int l = 0; l < kLanes; ++l) r = std::max(r, m[l]);
  return r;
}

// x[j] = exp(x[j] - sub) for j < n; returns their sum (in a fixed order).
KILN_ROW_KERNEL float ExpRow(float* x, int n, float sub) {
  VF acc{};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const VF e = Exp(Load(x + j) - sub);
    Store(x + j, e);
    acc += e;
  }
  if (j < n) {
    const VF e = Exp(LoadPart(x + j, n - j, -kInf) - sub);
    StorePart(x + j, e, n - j);
    acc += e;
  }
  float sum = 0;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  return sum;
}

// x[j] *= f for j < n.
KILN_ROW_KERNEL void ScaleRow(float* x, int n, float f) {
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) Store(x + j, Load(x + j) * f);
  for (; j < n; ++j) x[j] *= f;
}

// x[j] += y[j] for j < n.
KILN_ROW_KERNEL void AddRow(float* x, const float* y, int n) {
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) Store(x + j, Load(x + j) + Load(y + j));
  for (; j < n; ++j) x[j] += y[j];
}

// x[j] *= y[j] for j < n.
KILN_ROW_KERNEL void MulRow(float* x, const float* y, int n) {
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) Store(x + j, Load(x + j) * Load(y + j));
  for (; j < n; ++j) x[j] *= y[j];
}

// out[j] = x[j] * y[j] for j < n.
KILN_ROW_KERNEL void ProductRow(float* out, const float* x, const float* y,
                                int n) {
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    Store(out + j, Load(x + j) * Load(y + j));
  for (; j < n; ++j) out[j] = x[j] * y[j];
}

// The sum of x[j] * y[j] for j < n.
KILN_ROW_KERNEL float DotRow(const float* x, const float* y, int n) {
  VF acc{};
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) acc += Load(x + j) * Load(y + j);
  float sum = 0;
  for (; j < n; ++j) sum += x[j] * y[j];
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  return sum;
}

// ds[j] = p[j] * (ds[j] - d) * scale for j < n (ds holds dp).
KILN_ROW_KERNEL void ScoreGradRow(float* ds, const float* p, int n, float d,
                                  float scale) {
  int j = 0;
  for (; j + kLanes <= n; j += kLanes)
    Store(ds + j, Load(p + j) * (Load(ds + j) - d) * scale);
  for (; j < n; ++j) ds[j] = p[j] * (ds[j] - d) * scale;
}

// The same, and the scores' gradient before the scale added to bias_grad:
// g = p * (dp - d), bias_grad[j] += g, ds[j] = g * scale.
KILN_ROW_KERNEL void ScoreAndBiasGradRow(float* ds, const float* p, int n,
                                         float d, float scale,
                                         float* bias_grad) {
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const VF g = Load(p + j) * (Load(ds + j) - d);
    Store(bias_grad + j, Load(bias_grad + j) + g);
    Store(ds + j, g * scale);
  }
  for (; j < n; ++j) {
    const float g = p[j] * (ds[j] - d);
    bias_grad[j] += g;
    ds[j] = g * scale;
  }
}

// x[j] rounded to bfloat16, for j < n.
KILN_ROW_KERNEL void RoundBf16Row(float* x, int n) {
  int j = 0;
  for (; j + kLanes <= n; j += kLanes) Store(x + j, RoundBf16(Load(x + j)));
  if (j < n) StorePart(x + j, RoundBf16(LoadPart(x + j, n - j, 0)), n - j);
}

// Dropout factors of n consecutive score elements, the first at row-major
// index `first` over [B, H, L, S]: factor[j] = scale where element
// first + j is kept, else 0. Element x keeps iff the low 24 bits of word
// x % 4 of Philox4x32-10 call x / 4 at (seed, offset) are below
// `threshold`, as Kiln's dropout draws it (support/philox.h,
// graph/ops/random.h). 16 calls (64 elements) at a time: two groups of 8
// calls with their counters in 64-bit lanes (the 32 x 32-bit products
// exact), each word's keep decided across the 16 calls at once, the four
// words' factors then interleaved into element order.
KILN_ROW_KERNEL void DropoutFactors(uint64_t seed, uint64_t offset,
                                    int64_t first, int n, uint32_t threshold,
                                    float scale, float* factor) {
  typedef uint64_t VL __attribute__((vector_size(64)));
  typedef uint32_t VU __attribute__((vector_size(64)));
  constexpr uint64_t kLow = 0xffffffffu;
  constexpr int kCalls = 16;
  const int64_t call_end = (first + n + 3) / 4;
  alignas(64) float block[4 * kCalls];
  for (int64_t cb = first / 4; cb < call_end; cb += kCalls) {
    // Group g holds calls cb + 8g .. cb + 8g + 7.
    VL c0[2], c1[2], c2[2], c3[2];
    for (int g = 0; g < 2; ++g) {
      for (int lane = 0; lane < 8; ++lane) {
        const uint64_t call = static_cast<uint64_t>(cb + 8 * g + lane);
        c0[g][lane] = call & kLow;
        c1[g][lane] = call >> 32;
      }
      c2[g] = VL{} + (offset & kLow);
      c3[g] = VL{} + (offset >> 32);
    }
    uint64_t k0 = seed & kLow, k1 = seed >> 32;
    for (int r = 0; r < kPhiloxRounds; ++r) {
      for (int g = 0; g < 2; ++g) {
        const VL p0 = c0[g] * kPhiloxM0, p1 = c2[g] * kPhiloxM1;
        const VL n0 = (p1 >> 32) ^ c1[g] ^ k0, n2 = (p0 >> 32) ^ c3[g] ^ k1;
        c1[g] = p1 & kLow;
        c3[g] = p0 & kLow;
        c0[g] = n0;
        c2[g] = n2;
      }
      k0 = (k0 + kPhiloxW0) & kLow;
      k1 = (k1 + kPhiloxW1) & kLow;
    }
    // Word w of the 16 calls (the low halves of both groups' lanes), and
    // its factors.
    const VU evens = {0,  2,  4,  6,  8,  10, 12, 14,
                      16, 18, 20, 22, 24, 26, 28, 30};
    const VL* words[4] = {c0, c1, c2, c3};
    VF f[4];
    for (int w = 0; w < 4; ++w) {
      const VU word =
          __builtin_shuffle((VU)words[w][0], (VU)words[w][1], evens);
      f[w] =
          Select((VI)((word & 0xffffffu) < threshold), Broadcast(scale), VF{});
    }
    // Element 4c + w is f[w][c].
    const VI pairs_lo = {0, 16, 1, 17, 2, 18, 3, 19,
                         4, 20, 5, 21, 6, 22, 7, 23};
    const VI pairs_hi = pairs_lo + 8;
    const VF f01[2] = {__builtin_shuffle(f[0], f[1], pairs_lo),
                       __builtin_shuffle(f[0], f[1], pairs_hi)};
    const VF f23[2] = {__builtin_shuffle(f[2], f[3], pairs_lo),
                       __builtin_shuffle(f[2], f[3], pairs_hi)};
    const VI quads_lo = {0, 1, 16, 17, 2, 3, 18, 19,
                         4, 5, 20, 21, 6, 7, 22, 23};
    const VI quads_hi = quads_lo + 8;
    for (int h = 0; h < 2; ++h) {
      Store(block + 32 * h, __builtin_shuffle(f01[h], f23[h], quads_lo));
      Store(block + 32 * h + 16, __builtin_shuffle(f01[h], f23[h], quads_hi));
    }
    // The block's elements in [first, first + n).
    const int64_t at = cb * 4 - first;
    const int64_t lo = std::max<int64_t>(0, -at);
    const int64_t hi = std::min<int64_t>(4 * kCalls, n - at);
    if (lo < hi) {
      std::memcpy(factor + at + lo, block + lo,
                  static_cast<size_t>(hi - lo) * sizeof(float));
    }
  }
}

// ---- dtypes -------------------------------------------------------------

// n float32 values into `dtype` at out + offset elements.
void Narrow(DType dtype, const float* in, int64_t n, void* out,
            int64_t offset) {
  if (dtype == DType::kFloat32) {
    std::memcpy(static_cast<float*>(out) + offset, in,
                static_cast<size_t>(n) * sizeof(float));
    return;
  }
  uint16_t* h = static_cast<uint16_t*>(out) + offset;
  if (dtype == DType::kBFloat16) {
    for (int64_t i = 0; i < n; ++i) h[i] = FloatToBFloat16(in[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) h[i] = FloatToHalf(in[i]);
  }
}

// Rounds x[0, n) to `dtype` (nothing for float32).
void RoundRow(DType dtype, float* x, int n) {
  if (dtype == DType::kBFloat16) {
    RoundBf16Row(x, n);
  } else if (dtype == DType::kFloat16) {
    for (int j = 0; j < n; ++j) x[j] = HalfToFloat(FloatToHalf(x[j]));
  }
}

// A tensor of the call in float32: the buffer itself (float32), or a copy
// widened from float16/bfloat16.
class Floats {
 public:
  Floats(DType dtype, const void* data, int64_t n, ThreadPool* pool) {
    if (dtype == DType::kFloat32) {
      data_ = static_cast<const float*>(data);
    } else {
      copy_ = WidenToFloat32(dtype, data, n, pool);
      data_ = copy_.data();
    }
  }
  const float* get() const { return data_; }

 private:
  std::vector<float> copy_;
  const float* data_ = nullptr;
};

// ---- the call -----------------------------------------------------------

// One call's sizes, options and float32 inputs.
struct Call {
  int64_t b = 0, h = 0, l = 0, s = 0, e = 0, ev = 0;
  bool causal = false;
  float scale = 1;
  DType dtype = DType::kFloat32;
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* bias = nullptr;  // [bias_batch ? B : 1, bias_heads ? H : 1,
  bool bias_batch = false;      //  L, S], or null
  bool bias_heads = false;
  const CpuBlas* blas = nullptr;
  // Dropout (Attention.dropout > 0): the stream and how a draw keeps.
  bool dropout = false;
  uint64_t seed = 0, offset = 0;
  uint32_t keep_threshold = 0;
  float keep_scale = 1;

  // The dropout factors of keys [j0, j0 + n) of (bh, query i).
  void Factors(int64_t bh, int64_t i, int64_t j0, int n, float* f) const {
    DropoutFactors(seed, offset, (bh * l + i) * s + j0, n, keep_threshold,
                   keep_scale, f);
  }
  // The keys query row i attends to: [0, KeyEnd(i)).
  int64_t KeyEnd(int64_t i) const { return causal ? std::min(s, i + 1) : s; }
  // The bias row of (batch and head bh, query i), or null.
  const float* BiasRow(int64_t bh, int64_t i) const {
    if (bias == nullptr) return nullptr;
    const int64_t bb = bias_batch ? bh / h : 0;
    const int64_t hh = bias_heads ? bh % h : 0;
    return bias + ((bb * (bias_heads ? h : 1) + hh) * l + i) * s;
  }
  // Row r (query i) of a tile of scores over keys [j0, j0 + n): the bias
  // added, the keys after the query masked.
  void MaskRow(float* row, int64_t bh, int64_t i, int64_t j0, int n) const {
    if (const float* b = BiasRow(bh, i)) AddRow(row, b + j0, n);
    const int64_t end = KeyEnd(i) - j0;
    for (int64_t j = std::max<int64_t>(end, 0); j < n; ++j) row[j] = -kInf;
  }
};

// The first failure of a call's tasks (only oneDNN's products can fail).
class FirstError {
 public:
  void Note(absl::Status s) {
    if (s.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) status_ = std::move(s);
    failed_.store(true, std::memory_order_relaxed);
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  absl::Status status() {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

 private:
  std::mutex mu_;
  absl::Status status_;
  std::atomic<bool> failed_{false};
};

// Runs fn(i) for i < n over `pool`, or one after the other without one.
void Spread(ThreadPool* pool, int64_t n,
            const std::function<void(int64_t)>& fn) {
  if (pool != nullptr) {
    pool->ParallelFor(n, fn);
  } else {
    for (int64_t i = 0; i < n; ++i) fn(i);
  }
}

// Forward: out and lse of query block `qb` of (batch, head) `bh`.
absl::Status ForwardBlock(const Call& c, int64_t bh, int64_t i0, int rows,
                          void* out, float* lse) {
  const int64_t key_end = c.KeyEnd(i0 + rows - 1);
  const int kb = static_cast<int>(std::min<int64_t>(kKeyBlock, key_end));
  const int ev = static_cast<int>(c.ev);
  std::vector<float> scores(static_cast<size_t>(rows) * kb);
  std::vector<float> acc(static_cast<size_t>(rows) * ev, 0.0f);
  std::vector<float> mx(rows, -kInf), sum(rows, 0.0f);
  std::vector<float> factor(c.dropout ? kb : 0);
  const float* q = c.q + (bh * c.l + i0) * c.e;
  for (int64_t j0 = 0; j0 < key_end; j0 += kb) {
    const int n = static_cast<int>(std::min<int64_t>(kb, key_end - j0));
    if (absl::Status st = c.blas->TileSgemm(
            false, true, rows, n, static_cast<int>(c.e), c.scale, q,
            static_cast<int>(c.e), c.k + (bh * c.s + j0) * c.e,
            static_cast<int>(c.e), 0.0f, scores.data(), n);
        !st.ok()) {
      return st;
    }
    for (int r = 0; r < rows; ++r) {
      float* row = scores.data() + static_cast<size_t>(r) * n;
      c.MaskRow(row, bh, i0 + r, j0, n);
      const float m = std::max(mx[r], RowMax(row, n));
      // A row masked so far sums nothing (exp(-inf - 0) = 0).
      const float partial = ExpRow(row, n, m == -kInf ? 0.0f : m);
      const float correction = mx[r] == -kInf ? 0.0f : std::exp(mx[r] - m);
      if (correction != 1.0f)
        ScaleRow(acc.data() + static_cast<size_t>(r) * ev, ev, correction);
      sum[r] = sum[r] * correction + partial;
      mx[r] = m;
      // Dropped after the sum: lse and the normalisation are the
      // undropped softmax's.
      if (c.dropout) {
        c.Factors(bh, i0 + r, j0, n, factor.data());
        MulRow(row, factor.data(), n);
      }
      RoundRow(c.dtype, row, n);
    }
    if (absl::Status st = c.blas->TileSgemm(
            false, false, rows, ev, n, 1.0f, scores.data(), n,
            c.v + (bh * c.s + j0) * c.ev, ev, 1.0f, acc.data(), ev);
        !st.ok()) {
      return st;
    }
  }
  for (int r = 0; r < rows; ++r) {
    float* row = acc.data() + static_cast<size_t>(r) * ev;
    const int64_t i = bh * c.l + i0 + r;
    if (sum[r] > 0) {
      ScaleRow(row, ev, 1.0f / sum[r]);
      lse[i] = mx[r] + std::log(sum[r]);
    } else {  // every score -inf, or NaN
      std::fill(row, row + ev, std::numeric_limits<float>::quiet_NaN());
      lse[i] = std::numeric_limits<float>::quiet_NaN();
    }
    Narrow(c.dtype, row, ev, out, i * c.ev);
  }
  return absl::OkStatus();
}

absl::Status Forward(const Call& c, void* out, float* lse, ThreadPool* pool) {
  const int qb = QueryBlock(c.l);
  const int64_t blocks = (c.l + qb - 1) / qb;
  const int64_t bh = c.b * c.h;
  FirstError error;
  // The last query blocks first: under a causal mask they have the most
  // keys, and the threads take tasks in order.
  Spread(pool, bh * blocks, [&](int64_t t) {
    if (error.failed()) return;
    const int64_t block = blocks - 1 - t / bh;
    const int64_t i0 = block * qb;
    const int rows = static_cast<int>(std::min<int64_t>(qb, c.l - i0));
    error.Note(ForwardBlock(c, t % bh, i0, rows, out, lse));
  });
  return error.status();
}

// Backward of (batch, head) bh into float32 gradients dq [L, E], dk [S, E]
// and dv [S, Ev] (zeroed here), and, where `db` is not null, the scores'
// gradient before the scale added to db [L, S].
absl::Status BackwardHead(const Call& c, int64_t bh, const float* dout,
                          const float* out, const float* lse, float* dq,
                          float* dk, float* dv, float* db) {
  const int e = static_cast<int>(c.e), ev = static_cast<int>(c.ev);
  std::fill(dq, dq + c.l * c.e, 0.0f);
  std::fill(dk, dk + c.s * c.e, 0.0f);
  std::fill(dv, dv + c.s * c.ev, 0.0f);
  const float* q = c.q + bh * c.l * c.e;
  const float* k = c.k + bh * c.s * c.e;
  const float* v = c.v + bh * c.s * c.ev;
  dout += bh * c.l * c.ev;
  out += bh * c.l * c.ev;
  lse += bh * c.l;
  // rowsum(dout * out) per query.
  std::vector<float> d(static_cast<size_t>(c.l));
  for (int64_t i = 0; i < c.l; ++i)
    d[i] = DotRow(dout + i * c.ev, out + i * c.ev, ev);
  const int qb = QueryBlock(c.l);
  const int kb = static_cast<int>(std::min<int64_t>(kKeyBlock, c.s));
  const size_t tile = static_cast<size_t>(qb) * kb;
  // p: the probabilities; kept: what dv's product reads, p dropped and
  // rounded to the dtype (p itself for float32 without dropout); ds.
  const bool separate = c.dropout || c.dtype != DType::kFloat32;
  std::vector<float> p(tile), ds(tile), kept(separate ? tile : 0),
      factor(c.dropout ? tile : 0);
  for (int64_t i0 = 0; i0 < c.l; i0 += qb) {
    const int rows = static_cast<int>(std::min<int64_t>(qb, c.l - i0));
    const int64_t key_end = c.KeyEnd(i0 + rows - 1);
    for (int64_t j0 = 0; j0 < key_end; j0 += kb) {
      const int n = static_cast<int>(std::min<int64_t>(kb, key_end - j0));
      absl::Status st =
          c.blas->TileSgemm(false, true, rows, n, e, c.scale, q + i0 * c.e, e,
                            k + j0 * c.e, e, 0.0f, p.data(), n);
      if (!st.ok()) return st;
      for (int r = 0; r < rows; ++r) {
        const size_t at = static_cast<size_t>(r) * n;
        float* row = p.data() + at;
        c.MaskRow(row, bh, i0 + r, j0, n);
        ExpRow(row, n, lse[i0 + r]);
        if (!separate) continue;
        if (c.dropout) {
          c.Factors(bh, i0 + r, j0, n, factor.data() + at);
          ProductRow(kept.data() + at, row, factor.data() + at, n);
        } else {
          std::copy(row, row + n, kept.data() + at);
        }
        RoundRow(c.dtype, kept.data() + at, n);
      }
      // dv += kept^T @ dout; dp = dout @ v^T.
      st = c.blas->TileSgemm(true, false, n, ev, rows, 1.0f,
                             separate ? kept.data() : p.data(), n,
                             dout + i0 * c.ev, ev, 1.0f, dv + j0 * c.ev, ev);
      if (!st.ok()) return st;
      st = c.blas->TileSgemm(false, true, rows, n, ev, 1.0f, dout + i0 * c.ev,
                             ev, v + j0 * c.ev, ev, 0.0f, ds.data(), n);
      if (!st.ok()) return st;
      // ds = p * (dp * factor - rowsum(dout * out)) * scale, rounded.
      for (int r = 0; r < rows; ++r) {
        const size_t at = static_cast<size_t>(r) * n;
        float* row = ds.data() + at;
        if (c.dropout) MulRow(row, factor.data() + at, n);
        if (db != nullptr) {
          ScoreAndBiasGradRow(row, p.data() + at, n, d[i0 + r], c.scale,
                              db + (i0 + r) * c.s + j0);
        } else {
          ScoreGradRow(row, p.data() + at, n, d[i0 + r], c.scale);
        }
        RoundRow(c.dtype, row, n);
      }
      // dq += ds @ k; dk += ds^T @ q.
      st = c.blas->TileSgemm(false, false, rows, e, n, 1.0f, ds.data(), n,
                             k + j0 * c.e, e, 1.0f, dq + i0 * c.e, e);
      if (!st.ok()) return st;
      st = c.blas->TileSgemm(true, false, n, e, rows, 1.0f, ds.data(), n,
                             q + i0 * c.e, e, 1.0f, dk + j0 * c.e, e);
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

// Backward of (batch, head) bh, its gradients written to dq, dk and dv
// (and the scores' gradient added to db, as BackwardHead adds it).
absl::Status BackwardInto(const Call& c, int64_t bh, const float* dout,
                          const float* out, const float* lse, void* dq,
                          void* dk, void* dv, float* db) {
  // float32 gradients accumulate in place; others in float32 first.
  const bool f32 = c.dtype == DType::kFloat32;
  std::vector<float> scratch;
  if (!f32) scratch.resize(static_cast<size_t>((c.l + c.s) * c.e + c.s * c.ev));
  float* gq = f32 ? static_cast<float*>(dq) + bh * c.l * c.e : scratch.data();
  float* gk = f32 ? static_cast<float*>(dk) + bh * c.s * c.e : gq + c.l * c.e;
  float* gv = f32 ? static_cast<float*>(dv) + bh * c.s * c.ev : gk + c.s * c.e;
  absl::Status st = BackwardHead(c, bh, dout, out, lse, gq, gk, gv, db);
  if (st.ok() && !f32) {
    Narrow(c.dtype, gq, c.l * c.e, dq, bh * c.l * c.e);
    Narrow(c.dtype, gk, c.s * c.e, dk, bh * c.s * c.e);
    Narrow(c.dtype, gv, c.s * c.ev, dv, bh * c.s * c.ev);
  }
  return st;
}

// The most partial sums of one slice of the bias's gradient: a bias
// broadcast over all B x H heads sums them in this many runs of heads at
// once. A constant, so that the order of the sums does not depend on the
// threads.
constexpr int64_t kBiasGradRuns = 8;

absl::Status Backward(const Call& c, const float* dout, const float* out,
                      const float* lse, void* dq, void* dk, void* dv,
                      void* dbias, ThreadPool* pool) {
  FirstError error;
  if (dbias == nullptr) {
    Spread(pool, c.b * c.h, [&](int64_t bh) {
      if (error.failed()) return;
      error.Note(
          BackwardInto(c, bh, dout, out, lse, dq, dk, dv, /*db=*/nullptr));
    });
    return error.status();
  }
  // The bias's gradient: slice (bb, hh) of [B or 1, H or 1, L, S] sums the
  // heads (b, h) that read it, in `runs` partial sums of float32 [L, S]
  // each (heads m, m + runs, ... of the slice's), added in order at the
  // end.
  const int64_t batches = c.bias_batch ? c.b : 1;
  const int64_t heads = c.bias_heads ? c.h : 1;
  const int64_t slices = batches * heads;
  const int64_t members = c.b * c.h / slices;
  const int64_t runs = std::clamp<int64_t>(kBiasGradRuns / slices, 1, members);
  const int64_t plane = c.l * c.s;
  std::vector<float> partial(static_cast<size_t>(slices * runs * plane), 0.0f);
  // Head m of slice `slice`: (b, h) with the slice's fixed dims.
  auto head_of = [&](int64_t slice, int64_t m) {
    const int64_t bb = slice / heads, hh = slice % heads;
    const int64_t b = c.bias_batch ? bb : m / (c.bias_heads ? 1 : c.h);
    const int64_t h = c.bias_heads ? hh : m % c.h;
    return b * c.h + h;
  };
  Spread(pool, slices * runs, [&](int64_t t) {
    const int64_t slice = t / runs, run = t % runs;
    float* db = partial.data() + t * plane;
    for (int64_t m = run; m < members; m += runs) {
      if (error.failed()) return;
      error.Note(
          BackwardInto(c, head_of(slice, m), dout, out, lse, dq, dk, dv, db));
    }
  });
  if (error.failed()) return error.status();
  Spread(pool, slices, [&](int64_t slice) {
    float* sum = partial.data() + slice * runs * plane;
    for (int64_t run = 1; run < runs; ++run)
      AddRow(sum, sum + run * plane, static_cast<int>(plane));
    Narrow(c.dtype, sum, plane, dbias, slice * plane);
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status RunCpuAttention(const v1::Attention& attention,
                             const AttentionDims& dims,
                             absl::Span<void* const> buffers,
                             ThreadPool* pool) {
  const std::optional<DType> dtype = DTypeFromWire(attention.dtype());
  if (!dtype || (*dtype != DType::kFloat32 && *dtype != DType::kFloat16 &&
                 *dtype != DType::kBFloat16)) {
    return absl::UnimplementedError(
        "CPU attention takes float32, float16 or bfloat16");
  }
  const bool forward = attention.direction() == v1::Attention::FORWARD;
  const bool dropout = attention.dropout() > 0;
  const bool bias_grad = attention.bias_grad();
  if (bias_grad && (forward || !attention.bias())) {
    return absl::InvalidArgumentError(
        "CPU attention gives the bias's gradient only in a backward with a "
        "bias");
  }
  const size_t want = (forward ? 5 : 9) + (attention.bias() ? 1 : 0) +
                      (dropout ? 1 : 0) + (bias_grad ? 1 : 0);
  if (buffers.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CPU attention takes ", want, " buffers, got ", buffers.size()));
  }
  absl::StatusOr<const CpuBlas*> blas = CpuBlas::Get();
  if (!blas.ok()) return blas.status();
  Call c;
  c.b = dims.batch;
  c.h = dims.heads;
  c.l = dims.s_q;
  c.s = dims.s_kv;
  c.e = dims.d_qk;
  c.ev = dims.d_v;
  c.causal = attention.causal();
  c.scale = attention.scale();
  c.dtype = *dtype;
  c.blas = *blas;
  // The threads the tasks run on: none where each tile's products would
  // start threads of their own.
  if (!c.blas->TilesRunOnCaller(pool)) pool = nullptr;
  // Inputs widened where they are 16-bit, once per call (the tiles read
  // each key block once per query block).
  const int64_t bh = c.b * c.h;
  int next = 0;
  const Floats q(c.dtype, buffers[next++], bh * c.l * c.e, pool);
  const Floats k(c.dtype, buffers[next++], bh * c.s * c.e, pool);
  const Floats v(c.dtype, buffers[next++], bh * c.s * c.ev, pool);
  std::optional<Floats> bias;
  if (attention.bias()) {
    c.bias_batch = attention.bias_batch();
    c.bias_heads = attention.bias_heads();
    bias.emplace(
        c.dtype, buffers[next++],
        (c.bias_batch ? c.b : 1) * (c.bias_heads ? c.h : 1) * c.l * c.s, pool);
    c.bias = bias->get();
  }
  c.q = q.get();
  c.k = k.get();
  c.v = v.get();
  // The (seed, offset) pair follows the other reads.
  auto read_rng = [&] {
    if (!dropout) return;
    const auto* rng = static_cast<const int64_t*>(buffers[next++]);
    c.dropout = true;
    c.seed = static_cast<uint64_t>(rng[0]);
    c.offset = static_cast<uint64_t>(rng[1]);
    c.keep_threshold = static_cast<uint32_t>(
        std::clamp<int64_t>(attention.keep_threshold(), 0, int64_t{1} << 24));
    c.keep_scale = attention.keep_scale();
  };
  if (forward) {
    read_rng();
    return Forward(c, buffers[next], static_cast<float*>(buffers[next + 1]),
                   pool);
  }
  const Floats out(c.dtype, buffers[next++], bh * c.l * c.ev, pool);
  const auto* lse = static_cast<const float*>(buffers[next++]);
  const Floats dout(c.dtype, buffers[next++], bh * c.l * c.ev, pool);
  read_rng();
  return Backward(c, dout.get(), out.get(), lse, buffers[next],
                  buffers[next + 1], buffers[next + 2],
                  bias_grad ? buffers[next + 3] : nullptr, pool);
}

}  // namespace kiln
