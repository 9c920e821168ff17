// runtime/cuda_attention.h on a real GPU: cuDNN's fused attention, forward
// and backward, causal or not, float16 and bfloat16, against a float64
// reference computed from the same (rounded) inputs. Skipped without a GPU
// or without cuDNN, with the reason.
#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/compile.h"
#include "compiler/reference.h"
#include "graph/host_tensor.h"
#include "graph/import.h"
#include "gtest/gtest.h"
#include "runtime/cuda_attention.h"
#include "runtime/cuda_executable.h"
#include "support/philox.h"
#include "tests/gpu/gpu_util.h"
#include "tests/unit/attention_cases.h"

namespace kiln::testing {
namespace {

using gpu_testing::Gpu;

// Random values in [-1, 1) of `dtype`, rounded as the device reads them.
HostTensor Random(DType dtype, std::vector<int64_t> sizes, std::mt19937& rng) {
  HostTensor t = HostTensor::Empty(dtype, std::move(sizes));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (int64_t i = 0; i < t.numel(); ++i) t.SetDoubleAt(i, u(rng));
  return t;
}

struct Device {
  const Gpu* gpu;
  std::vector<cuda::DeviceMemory> owned;

  cuda::DevicePtr Alloc(size_t bytes) {
    auto mem = cuda::DeviceMemory::Allocate(*gpu->driver, gpu->context->get(),
                                            std::max<size_t>(bytes, 256));
    EXPECT_TRUE(mem.ok()) << mem.status();
    owned.push_back(*std::move(mem));
    return owned.back().get();
  }
  cuda::DevicePtr Upload(const HostTensor& t) {
    const size_t bytes = t.numel() * DTypeSize(t.dtype());
    const cuda::DevicePtr p = Alloc(bytes);
    EXPECT_TRUE(
        gpu->driver
            ->Check(gpu->driver->api().cuMemcpyHtoD_v2(p, t.data(), bytes),
                    "cuMemcpyHtoD")
            .ok());
    return p;
  }
  HostTensor Download(cuda::DevicePtr p, DType dtype,
                      std::vector<int64_t> sizes) {
    HostTensor h = HostTensor::Empty(dtype, std::move(sizes));
    EXPECT_TRUE(
        gpu->driver
            ->Check(gpu->driver->api().cuCtxSynchronize(), "cuCtxSynchronize")
            .ok());
    EXPECT_TRUE(gpu->driver
                    ->Check(gpu->driver->api().cuMemcpyDtoH_v2(
                                h.data(), p, h.numel() * DTypeSize(dtype)),
                            "cuMemcpyDtoH")
                    .ok());
    return h;
  }
};

// The float64 reference of contiguous [B, H, ., .] inputs: out, logsumexp
// and the three gradients. With `keep` ([B, H, Sq, Skv] flattened, 1 =
// kept), dropout with probability `dropout` applies that mask to the
// probabilities (lse stays the undropped softmax's). With `bias` ([B or 1,
// H or 1, Sq, Skv] as `bias_batch` and `bias_heads` say), the bias is added
// to the scaled scores and dbias is its gradient.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv, dbias;
};

struct BiasArg {
  const HostTensor* bias = nullptr;
  bool batch = false, heads = false;
};

Reference Attend(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                 const HostTensor& dout, const AttentionDims& d, bool causal,
                 double scale, const std::vector<char>* keep = nullptr,
                 double dropout = 0, BiasArg bias = {}) {
  Reference r;
  const int64_t bh = d.batch * d.heads;
  if (bias.bias != nullptr) r.dbias.assign(bias.bias->numel(), 0);
  // The bias element of score (i, j) of slice n.
  auto bias_at = [&](int64_t n, int64_t i, int64_t j) -> int64_t {
    const int64_t b = bias.batch ? n / d.heads : 0;
    const int64_t h = bias.heads ? n % d.heads : 0;
    return ((b * (bias.heads ? d.heads : 1) + h) * d.s_q + i) * d.s_kv + j;
  };
  r.out.assign(bh * d.s_q * d.d_v, 0);
  r.lse.assign(bh * d.s_q, 0);
  r.dq.assign(bh * d.s_q * d.d_qk, 0);
  r.dk.assign(bh * d.s_kv * d.d_qk, 0);
  r.dv.assign(bh * d.s_kv * d.d_v, 0);
  std::vector<double> p(d.s_q * d.s_kv), dp(d.s_q * d.s_kv);
  for (int64_t n = 0; n < bh; ++n) {
    // The dropout factor of score (i, j): keep / (1 - dropout), else 1.
    auto M = [&](int64_t i, int64_t j) {
      if (keep == nullptr) return 1.0;
      return (*keep)[(n * d.s_q + i) * d.s_kv + j] ? 1.0 / (1.0 - dropout)
                                                   : 0.0;
    };
    auto Q = [&](int64_t i, int64_t e) {
      return q.GetDoubleAt((n * d.s_q + i) * d.d_qk + e);
    };
    auto K = [&](int64_t j, int64_t e) {
      return k.GetDoubleAt((n * d.s_kv + j) * d.d_qk + e);
    };
    auto V = [&](int64_t j, int64_t e) {
      return v.GetDoubleAt((n * d.s_kv + j) * d.d_v + e);
    };
    auto DO = [&](int64_t i, int64_t e) {
      return dout.GetDoubleAt((n * d.s_q + i) * d.d_v + e);
    };
    for (int64_t i = 0; i < d.s_q; ++i) {
      double mx = -INFINITY;
      for (int64_t j = 0; j < d.s_kv; ++j) {
        double s = 0;
        for (int64_t e = 0; e < d.d_qk; ++e) s += Q(i, e) * K(j, e);
        if (bias.bias != nullptr)
          s = s * scale + bias.bias->GetDoubleAt(bias_at(n, i, j));
        else
          s *= scale;
        if (causal && j > i) s = -INFINITY;
        p[i * d.s_kv + j] = s;
        mx = std::max(mx, s);
      }
      double sum = 0;
      for (int64_t j = 0; j < d.s_kv; ++j)
        sum += p[i * d.s_kv + j] = std::exp(p[i * d.s_kv + j] - mx);
      for (int64_t j = 0; j < d.s_kv; ++j) p[i * d.s_kv + j] /= sum;
      r.lse[n * d.s_q + i] = mx + std::log(sum);
      for (int64_t e = 0; e < d.d_v; ++e) {
        double o = 0;
        for (int64_t j = 0; j < d.s_kv; ++j)
          o += p[i * d.s_kv + j] * M(i, j) * V(j, e);
        r.out[(n * d.s_q + i) * d.d_v + e] = o;
      }
    }
    for (int64_t i = 0; i < d.s_q; ++i) {
      double rowdot = 0;
      for (int64_t j = 0; j < d.s_kv; ++j) {
        double g = 0;
        for (int64_t e = 0; e < d.d_v; ++e) g += DO(i, e) * V(j, e);
        g *= M(i, j);
        dp[i * d.s_kv + j] = g;
        rowdot += g * p[i * d.s_kv + j];
      }
      for (int64_t j = 0; j < d.s_kv; ++j) {
        const double pij = p[i * d.s_kv + j];
        const double g = pij * (dp[i * d.s_kv + j] - rowdot);
        const double ds = g * scale;
        if (bias.bias != nullptr) r.dbias[bias_at(n, i, j)] += g;
        for (int64_t e = 0; e < d.d_v; ++e)
          r.dv[(n * d.s_kv + j) * d.d_v + e] += pij * M(i, j) * DO(i, e);
        for (int64_t e = 0; e < d.d_qk; ++e) {
          r.dq[(n * d.s_q + i) * d.d_qk + e] += ds * K(j, e);
          r.dk[(n * d.s_kv + j) * d.d_qk + e] += ds * Q(i, e);
        }
      }
    }
  }
  return r;
}

// max |got - want| / max(floor, max |want|).
double Error(const HostTensor& got, const std::vector<double>& want,
             double floor = 1) {
  double err = 0, scale = floor;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(got.GetDoubleAt(i) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

TEST(CudaGpu, CudnnAttentionMatchesReference) {
  absl::StatusOr<Gpu*> gpu = gpu_testing::OpenGpu();
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device: " << gpu.status();
  auto ctx =
      cuda::ScopedContext::Enter(*(*gpu)->driver, (*gpu)->context->get());
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  absl::StatusOr<std::unique_ptr<CudaAttention>> attention =
      CudaAttention::Create((*gpu)->context->get());
  if (!attention.ok()) GTEST_SKIP() << attention.status();
  std::printf("cuDNN %zu (%s)\n", (*attention)->version(),
              (*attention)->library().c_str());
  struct Case {
    AttentionDims dims;
    bool causal;
    DType dtype;
  };
  const Case cases[] = {
      {{2, 3, 128, 128, 64, 64}, true, DType::kBFloat16},
      {{2, 3, 128, 128, 64, 64}, false, DType::kFloat16},
      {{1, 2, 77, 77, 64, 64}, true, DType::kFloat16},
      {{2, 2, 100, 200, 128, 128}, false, DType::kBFloat16},
      {{1, 4, 256, 256, 32, 32}, true, DType::kBFloat16},
      // Head dims above 128 (cuDNN 9 on sm_90).
      {{2, 2, 128, 128, 256, 256}, true, DType::kBFloat16},
      {{1, 3, 96, 160, 160, 160}, false, DType::kFloat16},
      {{2, 2, 64, 64, 192, 192}, false, DType::kBFloat16},
  };
  std::mt19937 rng(7);
  int step = 0;
  for (const Case& c : cases) {
    const AttentionDims& d = c.dims;
    SCOPED_TRACE(absl::StrCat(DTypeName(c.dtype), c.causal ? " causal " : " ",
                              d.batch, "x", d.heads, "x", d.s_q, "x", d.s_kv,
                              "x", d.d_qk));
    const double scale = 1.0 / std::sqrt(static_cast<double>(d.d_qk));
    const HostTensor q =
        Random(c.dtype, {d.batch, d.heads, d.s_q, d.d_qk}, rng);
    const HostTensor k =
        Random(c.dtype, {d.batch, d.heads, d.s_kv, d.d_qk}, rng);
    const HostTensor v =
        Random(c.dtype, {d.batch, d.heads, d.s_kv, d.d_v}, rng);
    const HostTensor dout =
        Random(c.dtype, {d.batch, d.heads, d.s_q, d.d_v}, rng);
    const Reference want = Attend(q, k, v, dout, d, c.causal, scale);

    Device dev{*gpu};
    const cuda::DevicePtr dq_ = dev.Upload(q), dk_ = dev.Upload(k),
                          dv_ = dev.Upload(v), ddo = dev.Upload(dout);
    const size_t es = DTypeSize(c.dtype);
    const cuda::DevicePtr out =
        dev.Alloc(d.batch * d.heads * d.s_q * d.d_v * es);
    const cuda::DevicePtr stats = dev.Alloc(d.batch * d.heads * d.s_q * 4);
    absl::StatusOr<CudaAttention::Prepared> fwd =
        (*attention)
            ->Prepare(step++, CudaAttention::Direction::kForward, c.dtype, d,
                      {.causal = c.causal, .scale = static_cast<float>(scale)});
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    const cuda::DevicePtr ws = dev.Alloc(fwd->workspace_bytes);
    absl::Status run =
        (*attention)->Run(*fwd, {dq_, dk_, dv_, out, stats}, ws, nullptr);
    ASSERT_TRUE(run.ok()) << run;
    const HostTensor got_out =
        dev.Download(out, c.dtype, {d.batch, d.heads, d.s_q, d.d_v});
    const HostTensor got_lse =
        dev.Download(stats, DType::kFloat32, {d.batch, d.heads, d.s_q});
    const double tol = c.dtype == DType::kBFloat16 ? 2e-2 : 4e-3;
    EXPECT_LT(Error(got_out, want.out), tol);
    EXPECT_LT(Error(got_lse, want.lse), 1e-3);

    absl::StatusOr<CudaAttention::Prepared> bwd =
        (*attention)
            ->Prepare(step++, CudaAttention::Direction::kBackward, c.dtype, d,
                      {.causal = c.causal, .scale = static_cast<float>(scale)});
    ASSERT_TRUE(bwd.ok()) << bwd.status();
    const cuda::DevicePtr bws = dev.Alloc(bwd->workspace_bytes);
    const cuda::DevicePtr gq = dev.Alloc(q.numel() * es),
                          gk = dev.Alloc(k.numel() * es),
                          gv = dev.Alloc(v.numel() * es);
    run = (*attention)
              ->Run(*bwd, {dq_, dk_, dv_, out, stats, ddo, gq, gk, gv}, bws,
                    nullptr);
    ASSERT_TRUE(run.ok()) << run;
    const double gtol = c.dtype == DType::kBFloat16 ? 3e-2 : 8e-3;
    EXPECT_LT(Error(dev.Download(gq, c.dtype, q.sizes()), want.dq), gtol);
    EXPECT_LT(Error(dev.Download(gk, c.dtype, k.sizes()), want.dk), gtol);
    EXPECT_LT(Error(dev.Download(gv, c.dtype, v.sizes()), want.dv), gtol);
    std::printf("%s%s %lldx%lldx%lldx%lldx%lld: out %.2e lse %.2e dq %.2e\n",
                std::string(DTypeName(c.dtype)).c_str(),
                c.causal ? " causal" : "", static_cast<long long>(d.batch),
                static_cast<long long>(d.heads), static_cast<long long>(d.s_q),
                static_cast<long long>(d.s_kv), static_cast<long long>(d.d_qk),
                Error(got_out, want.out), Error(got_lse, want.lse),
                Error(dev.Download(gq, c.dtype, q.sizes()), want.dq));
  }
}

// The bias's gradient from cuDNN's backward (AttentionOptions::bias_grad)
// for each bias shape, causal or not, against the float64 reference: every
// gradient and the bias's. A shape cuDNN has no engine for must say
// UNIMPLEMENTED (printed); [1, H, Sq, Skv], the shape cuDNN documents for
// dBias, must run.
TEST(CudaGpu, CudnnAttentionBiasGradient) {
  absl::StatusOr<Gpu*> gpu = gpu_testing::OpenGpu();
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device: " << gpu.status();
  auto ctx =
      cuda::ScopedContext::Enter(*(*gpu)->driver, (*gpu)->context->get());
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  absl::StatusOr<std::unique_ptr<CudaAttention>> attention =
      CudaAttention::Create((*gpu)->context->get());
  if (!attention.ok()) GTEST_SKIP() << attention.status();
  if ((*attention)->version() < 90600) GTEST_SKIP() << "cuDNN before 9.6";
  std::mt19937 rng(11);
  int step = 0, ran = 0;
  bool per_head_ran = false;
  const AttentionDims shapes[] = {{2, 3, 197, 197, 64, 64},
                                  {2, 4, 128, 256, 64, 64}};
  for (const AttentionDims& d : shapes) {
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      for (int shape = 0; shape < 4; ++shape) {
        const bool bias_batch = shape & 1, bias_heads = shape & 2;
        for (bool causal : {false, true}) {
          const std::string name = absl::StrCat(
              DTypeName(dtype), causal ? " causal " : " ", d.batch, "x",
              d.heads, "x", d.s_q, "x", d.s_kv, "x", d.d_qk, " bias [",
              bias_batch ? "B" : "1", ",", bias_heads ? "H" : "1", ",L,S]");
          SCOPED_TRACE(name);
          const double scale = 1.0 / std::sqrt(static_cast<double>(d.d_qk));
          const HostTensor q =
              Random(dtype, {d.batch, d.heads, d.s_q, d.d_qk}, rng);
          const HostTensor k =
              Random(dtype, {d.batch, d.heads, d.s_kv, d.d_qk}, rng);
          const HostTensor v =
              Random(dtype, {d.batch, d.heads, d.s_kv, d.d_v}, rng);
          const HostTensor dout =
              Random(dtype, {d.batch, d.heads, d.s_q, d.d_v}, rng);
          const HostTensor bias =
              Random(dtype,
                     {bias_batch ? d.batch : 1, bias_heads ? d.heads : 1, d.s_q,
                      d.s_kv},
                     rng);
          const Reference want =
              Attend(q, k, v, dout, d, causal, scale, nullptr, 0,
                     {&bias, bias_batch, bias_heads});
          const AttentionOptions fwd_options{.causal = causal,
                                             .scale = static_cast<float>(scale),
                                             .bias = true,
                                             .bias_batch = bias_batch,
                                             .bias_heads = bias_heads};
          AttentionOptions bwd_options = fwd_options;
          bwd_options.bias_grad = true;
          absl::StatusOr<CudaAttention::Prepared> bwd =
              (*attention)
                  ->Prepare(step++, CudaAttention::Direction::kBackward, dtype,
                            d, bwd_options);
          if (!bwd.ok()) {
            EXPECT_EQ(bwd.status().code(), absl::StatusCode::kUnimplemented)
                << bwd.status();
            EXPECT_FALSE(bias_heads && !bias_batch) << bwd.status();
            std::printf("no engine: %s\n", name.c_str());
            continue;
          }
          absl::StatusOr<CudaAttention::Prepared> fwd =
              (*attention)
                  ->Prepare(step++, CudaAttention::Direction::kForward, dtype,
                            d, fwd_options);
          ASSERT_TRUE(fwd.ok()) << fwd.status();
          Device dev{*gpu};
          const cuda::DevicePtr q_ = dev.Upload(q), k_ = dev.Upload(k),
                                v_ = dev.Upload(v), do_ = dev.Upload(dout),
                                b_ = dev.Upload(bias);
          const size_t es = DTypeSize(dtype);
          const cuda::DevicePtr out =
              dev.Alloc(d.batch * d.heads * d.s_q * d.d_v * es);
          const cuda::DevicePtr stats =
              dev.Alloc(d.batch * d.heads * d.s_q * 4);
          absl::Status run =
              (*attention)
                  ->Run(*fwd, {q_, k_, v_, b_, out, stats},
                        dev.Alloc(fwd->workspace_bytes), nullptr);
          ASSERT_TRUE(run.ok()) << run;
          const cuda::DevicePtr gq = dev.Alloc(q.numel() * es),
                                gk = dev.Alloc(k.numel() * es),
                                gv = dev.Alloc(v.numel() * es),
                                gb = dev.Alloc(bias.numel() * es);
          run =
              (*attention)
                  ->Run(*bwd, {q_, k_, v_, b_, out, stats, do_, gq, gk, gv, gb},
                        dev.Alloc(bwd->workspace_bytes), nullptr);
          ASSERT_TRUE(run.ok()) << run;
          const double tol = dtype == DType::kBFloat16 ? 2e-2 : 4e-3;
          const double gtol = dtype == DType::kBFloat16 ? 3e-2 : 8e-3;
          const HostTensor got_out =
              dev.Download(out, dtype, {d.batch, d.heads, d.s_q, d.d_v});
          EXPECT_LT(Error(got_out, want.out), tol);
          const double errs[] = {
              Error(dev.Download(gq, dtype, q.sizes()), want.dq, 1e-6),
              Error(dev.Download(gk, dtype, k.sizes()), want.dk, 1e-6),
              Error(dev.Download(gv, dtype, v.sizes()), want.dv, 1e-6),
              Error(dev.Download(gb, dtype, bias.sizes()), want.dbias, 1e-6)};
          for (int o = 0; o < 4; ++o)
            EXPECT_LT(errs[o], gtol) << "gradient "
                                     << "qkvb"[o];
          std::printf("%s: out %.2e dq %.2e dk %.2e dv %.2e dbias %.2e\n",
                      name.c_str(), Error(got_out, want.out), errs[0], errs[1],
                      errs[2], errs[3]);
          ++ran;
          per_head_ran |= bias_heads && !bias_batch;
        }
      }
    }
  }
  EXPECT_TRUE(per_head_ran);
  std::printf("%d bias-gradient attention calls checked\n", ran);
  // With dropout: whether cuDNN has an engine (printed; not checked).
  for (int shape = 0; shape < 4; ++shape) {
    const AttentionDims d{2, 3, 197, 197, 64, 64};
    AttentionOptions o{.scale = 0.125f,
                       .bias = true,
                       .bias_batch = static_cast<bool>(shape & 1),
                       .bias_heads = static_cast<bool>(shape & 2),
                       .dropout = 0.1f,
                       .bias_grad = true};
    absl::StatusOr<CudaAttention::Prepared> bwd =
        (*attention)
            ->Prepare(step++, CudaAttention::Direction::kBackward,
                      DType::kBFloat16, d, o);
    std::printf("dropout bias [%s,%s,L,S] backward: %s\n",
                o.bias_batch ? "B" : "1", o.bias_heads ? "H" : "1",
                bwd.ok() ? "engine" : bwd.status().ToString().c_str());
  }
}

// kiln.attention and its backward compiled for the GPU (one cuDNN call
// each in float16/bfloat16; GEMMs around a softmax in float32 and under
// deterministic_algorithms), run through CudaExecutable, against the
// reference: out and lse under the dtype's tolerance, the gradients
// relative to the largest one.
TEST(CudaGpu, CompiledAttentionMatchesReference) {
  absl::StatusOr<Gpu*> gpu = gpu_testing::OpenGpu();
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device: " << gpu.status();
  using attention_cases::Case;
  std::vector<Case> cases;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    Case c;
    c.dtype = dtype;
    c.b = 2, c.h = 4, c.l = 96, c.s = 96, c.e = c.ev = 64;
    c.causal = true;
    c.scale = 0.125;
    cases.push_back(c);
    c.causal = false;
    c.l = 40, c.s = 130;
    c.strided_q = true;
    cases.push_back(c);
  }
  for (Case::Bias bias : {Case::Bias::kPerBatch, Case::Bias::kPerHeadRow}) {
    Case c = cases[0];  // bfloat16 causal 2x4x96x96x64
    c.bias = bias;
    cases.push_back(c);
  }
  // The bias's gradient from cuDNN's dBias (written out under
  // deterministic_algorithms), each bias shape.
  for (Case::Bias bias : attention_cases::kEveryBias) {
    Case c = cases[bias == Case::Bias::kFull ? 3 : 0];  // bf16 or fp16
    c.bias = bias;
    c.bias_grad = true;
    if (bias == Case::Bias::kShared) c.l = c.s = 197, c.causal = false;
    cases.push_back(c);
  }
  Case wide;
  wide.dtype = DType::kBFloat16;
  wide.b = 1, wide.h = 2, wide.l = wide.s = 200, wide.e = wide.ev = 128;
  wide.causal = true;
  cases.push_back(wide);
  // Head dims above 128: cuDNN on sm_90 and later (GEMMs elsewhere).
  wide.dtype = DType::kFloat16;
  wide.l = 64, wide.s = 72, wide.e = wide.ev = 256;
  wide.causal = false;
  cases.push_back(wide);
  int calls = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    for (bool deterministic : {false, true}) {
      const Case& c = cases[i];
      SCOPED_TRACE(
          absl::StrCat(c.ToString(), deterministic ? " deterministic" : ""));
      v1::CompileRequest req;
      *req.mutable_graph() = attention_cases::CaseGraph(c, v1::CUDA);
      req.mutable_target()->mutable_cuda()->set_arch((*gpu)->arch);
      req.mutable_options()->set_deterministic_algorithms(deterministic);
      auto graph = ImportGraph(req.graph());
      ASSERT_TRUE(graph.ok()) << graph.status();
      auto artifact = Compile(req);
      ASSERT_TRUE(artifact.ok()) << artifact.status();
      for (const v1::Step& s : artifact->program().steps())
        calls += s.has_call() && s.call().has_attention();
      auto exe = CudaExecutable::Load(*artifact);
      ASSERT_TRUE(exe.ok()) << exe.status();
      std::mt19937_64 rng(31 + i);
      const std::vector<HostTensor> inputs =
          attention_cases::CaseInputs(c, c.l, rng);
      auto want = EvaluateReference(*graph, inputs);
      ASSERT_TRUE(want.ok()) << want.status();
      std::vector<gpu_testing::DeviceInput> dev;
      std::vector<DeviceTensorView> views;
      for (const HostTensor& t : inputs) {
        auto d = gpu_testing::Upload(**gpu, t);
        ASSERT_TRUE(d.ok()) << d.status();
        dev.push_back(*std::move(d));
      }
      for (const auto& d : dev) views.push_back(d.view());
      auto got = (*exe)->Run(views, nullptr);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(got->size(), c.bias_grad ? 6u : 5u);
      for (int o = 0; o < static_cast<int>(got->size()); ++o) {
        auto host = gpu_testing::Download(**gpu, (*got)[o], nullptr);
        ASSERT_TRUE(host.ok()) << host.status();
        if (o >= 2) {
          // Under deterministic_algorithms the backward is GEMMs around a
          // softmax whose scores cuBLASLt writes in the inputs' dtype (as
          // PyTorch's math attention rounds them): one more rounding, twice
          // the half-precision limits (float16 at head dim 256 measured
          // 6.3e-3 on an H200).
          const double limit =
              c.dtype == DType::kBFloat16  ? (deterministic ? 6e-2 : 3e-2)
              : c.dtype == DType::kFloat16 ? (deterministic ? 8e-3 : 4e-3)
                                           : 2e-3;
          EXPECT_LT(attention_cases::RelativeToLargest(*host, (*want)[o]),
                    limit)
              << "output " << o;
        } else {
          EXPECT_EQ(Compare(*host, (*want)[o]), "") << "output " << o;
        }
      }
    }
  }
  std::printf("%zu attention graphs twice, %d cuDNN attention calls\n",
              cases.size(), calls);
}

// kiln.attention_dropout compiled for the GPU. float16/bfloat16 run cuDNN's
// fused attention with its own Philox mask: one run with v the identity
// exposes the mask (out is the dropped probabilities), and a run with the
// same seed and real inputs must equal attention with that mask, forward
// and backward, in double; about 1 - p of the live probabilities are kept,
// and rng is (the op's own seed, the library bit). Under
// deterministic_algorithms Kiln's kernels draw the reference's Philox mask:
// every output against the reference evaluator.
TEST(CudaGpu, CompiledAttentionDropout) {
  absl::StatusOr<Gpu*> gpu = gpu_testing::OpenGpu();
  if (!gpu.ok()) GTEST_SKIP() << "no CUDA device: " << gpu.status();
  using attention_cases::Case;
  constexpr double kP = 0.2;
  int checked = 0;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (bool causal : {false, true}) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool deterministic = variant & 1;
        const bool bias_grad = variant & 2;  // a [1, H, L, S] learned bias
        Case c;
        c.dtype = dtype;
        c.b = 2, c.h = 3, c.l = 40, c.s = 64, c.e = 64, c.ev = 64;
        c.causal = causal;
        c.scale = 0.125;
        c.dropout = kP;
        if (bias_grad) c.bias = Case::Bias::kPerHead, c.bias_grad = true;
        SCOPED_TRACE(
            absl::StrCat(c.ToString(), deterministic ? " deterministic" : ""));
        v1::CompileRequest req;
        *req.mutable_graph() = attention_cases::CaseGraph(c, v1::CUDA);
        req.mutable_target()->mutable_cuda()->set_arch((*gpu)->arch);
        req.mutable_options()->set_deterministic_algorithms(deterministic);
        auto graph = ImportGraph(req.graph());
        ASSERT_TRUE(graph.ok()) << graph.status();
        auto artifact = Compile(req);
        ASSERT_TRUE(artifact.ok()) << artifact.status();
        int calls = 0;
        for (const v1::Step& s : artifact->program().steps())
          calls += s.has_call() && s.call().has_attention();
        EXPECT_EQ(calls, deterministic ? 0 : 2);
        auto exe = CudaExecutable::Load(*artifact);
        ASSERT_TRUE(exe.ok()) << exe.status();
        std::mt19937_64 rng(71);
        const std::vector<HostTensor> inputs =
            attention_cases::CaseInputs(c, c.l, rng);
        auto run = [&](const std::vector<HostTensor>& in) {
          std::vector<HostTensor> outs;
          std::vector<gpu_testing::DeviceInput> dev;
          std::vector<DeviceTensorView> views;
          for (const HostTensor& t : in) {
            auto d = gpu_testing::Upload(**gpu, t);
            EXPECT_TRUE(d.ok()) << d.status();
            if (!d.ok()) return outs;
            dev.push_back(*std::move(d));
          }
          for (const auto& d : dev) views.push_back(d.view());
          auto got = (*exe)->Run(views, nullptr);
          EXPECT_TRUE(got.ok()) << got.status();
          if (!got.ok()) return outs;
          for (const auto& t : *got) {
            auto host = gpu_testing::Download(**gpu, t, nullptr);
            EXPECT_TRUE(host.ok()) << host.status();
            if (host.ok()) outs.push_back(*std::move(host));
          }
          return outs;
        };
        const std::vector<HostTensor> got = run(inputs);
        const size_t rng_out = bias_grad ? 6 : 5;
        ASSERT_EQ(got.size(), rng_out + 1);
        // rng: (seed, 3) for Kiln's Philox; for cuDNN a seed of the op's
        // own, words 0 and 1 of Philox(seed, 3, 0) (63 bits), and the
        // library's flag as the offset.
        const int64_t seed = inputs.back().GetIntAt(0);
        const std::array<uint32_t, 4> w =
            Philox4x32(static_cast<uint64_t>(seed), 3, 0);
        const int64_t op_seed =
            (static_cast<int64_t>(w[1] & 0x7fffffffu) << 32) | w[0];
        EXPECT_EQ(got[rng_out].GetIntAt(0), deterministic ? seed : op_seed);
        EXPECT_EQ(got[rng_out].GetIntAt(1),
                  deterministic ? 3 : int64_t{1} << 62);
        const double grad_limit = dtype == DType::kBFloat16 ? 6e-2 : 8e-3;
        if (deterministic) {
          auto want = EvaluateReference(*graph, inputs);
          ASSERT_TRUE(want.ok()) << want.status();
          for (int o = 0; o < static_cast<int>(rng_out); ++o) {
            const double err =
                attention_cases::RelativeToLargest(got[o], (*want)[o]);
            EXPECT_LT(err, o < 2 ? grad_limit / 2 : grad_limit)
                << "output " << o;
          }
          ++checked;
          continue;
        }
        // The mask, from v = identity.
        // (A copy of a HostTensor shares its storage: v is a new tensor.)
        std::vector<HostTensor> eye = inputs;
        eye[2] = HostTensor::Empty(c.dtype, {c.b, c.h, c.s, c.ev});
        for (int64_t i = 0; i < eye[2].numel(); ++i) {
          const int64_t e = i % c.ev, j = (i / c.ev) % c.s;
          eye[2].SetDoubleAt(i, j == e ? 1.0 : 0.0);
        }
        const std::vector<HostTensor> exposed = run(eye);
        ASSERT_EQ(exposed.size(), rng_out + 1);
        std::vector<char> keep(exposed[0].numel());
        int64_t live = 0, kept = 0;
        for (int64_t x = 0; x < exposed[0].numel(); ++x) {
          keep[x] = exposed[0].GetDoubleAt(x) != 0;
          const int64_t j = x % c.s, i = (x / c.s) % c.l;
          if (c.causal && j > i) continue;
          ++live;
          kept += keep[x];
        }
        EXPECT_NEAR(static_cast<double>(kept) / live, 1.0 - kP, 0.03);
        const AttentionDims dims{.batch = c.b,
                                 .heads = c.h,
                                 .s_q = c.l,
                                 .s_kv = c.s,
                                 .d_qk = c.e,
                                 .d_v = c.ev};
        const Reference ref =
            Attend(inputs[0], inputs[1], inputs[2], inputs[3], dims, c.causal,
                   c.scale, &keep, kP,
                   bias_grad ? BiasArg{&inputs[4], false, true} : BiasArg{});
        const std::vector<double>* want[] = {&ref.out, &ref.dq, &ref.dk,
                                             &ref.dv, &ref.dbias};
        for (int o = 0; o < (bias_grad ? 5 : 4); ++o) {
          const double err =
              Error(got[o == 0 ? 0 : o + 1], *want[o], /*floor=*/1e-6);
          EXPECT_LT(err, o == 0 ? grad_limit / 2 : grad_limit)
              << "output " << (o == 0 ? 0 : o + 1);
        }
        ++checked;
      }
    }
  }
  std::printf("%d dropout attention graphs checked\n", checked);
}

}  // namespace
}  // namespace kiln::testing
