// libFuzzer target for everything a compile request reaches before code
// generation: the request decoders (binary protobuf, and the JSON mapping
// when the input looks like text), ImportGraph, ValidateTarget, the guard key
// and its explanation, and the reference evaluator on small inputs.
//
// Bad input must never crash the daemon (DESIGN.md, decision 8), so any
// crash, sanitizer report or broken invariant here is a bug. Invariants
// checked beyond "no crash":
//   - ComputeGuardKey == CombineKeyComponents(ExplainKey), each component's
//     hash is the SHA-256 of its canonical text;
//   - the key is the same after renaming values and symbols and reordering
//     nodes (when the rewritten request imports, which it must);
//   - the reference evaluator's outputs have the dtypes and sizes that
//     ImportGraph inferred.
//
//   make fuzz FUZZ_SECONDS=600     (seeds: tests/fuzz/seeds)
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "graph/graph.h"
#include "graph/guard_key.h"
#include "graph/host_tensor.h"
#include "graph/import.h"
#include "graph/op_signature.h"
#include "compiler/reference.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/json_util.h"
#include "kiln/v1/graph.pb.h"
#include "support/sha256.h"
#include "tests/unit/graph_gen.h"

namespace kiln {
namespace {

// Evaluation is skipped beyond these, to keep executions fast.
constexpr int64_t kMaxElementsPerValue = 4096;
constexpr int64_t kMaxElementsTotal = 1 << 16;
constexpr int64_t kMaxStorage = 1 << 16;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_request invariant broken: %s\n%s\n", what,
               detail.c_str());
  std::abort();
}

// A small deterministic generator seeded from the input, so a reproducer
// replays exactly.
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t state_;
};

// A value for each symbol in 2..5 that respects its declared facts, or false
// when none is small enough.
bool ChooseSymbols(const Graph& graph, SplitMix& rng,
                   std::vector<int64_t>* values) {
  // Symbols no input size binds take kMinSymbolValue in EvaluateReference.
  std::vector<bool> bound(graph.symbols.size(), false);
  for (const GraphInput& in : graph.inputs) {
    for (const SymExpr& e : graph.type(in.value).sizes) {
      if (std::optional<int> s = e.AsSymbol()) bound[*s] = true;
    }
  }
  for (size_t i = 0; i < graph.symbols.size(); ++i) {
    const SymbolInfo& s = graph.symbols[i];
    if (!bound[i]) {
      values->push_back(kMinSymbolValue);
      continue;
    }
    const int64_t m = s.multiple_of > 1 ? s.multiple_of : 1;
    if (m > 64) return false;
    int64_t v = 2 + static_cast<int64_t>(rng.Next() % 4);
    v = (v + m - 1) / m * m;
    if (s.max_value > 0 && v > s.max_value) v = (2 + m - 1) / m * m;
    if (s.max_value > 0 && v > s.max_value) return false;
    values->push_back(v);
  }
  return true;
}

// Concrete sizes of `sizes`, or false when any is negative or the element
// count exceeds kMaxElementsPerValue.
bool ConcreteSizes(const std::vector<SymExpr>& sizes,
                   absl::Span<const int64_t> symbols, std::vector<int64_t>* out,
                   int64_t* numel) {
  *numel = 1;
  for (const SymExpr& e : sizes) {
    const int64_t v = e.Evaluate(symbols);
    if (v < 0 || v > kMaxElementsPerValue) return false;
    out->push_back(v);
    *numel *= v;
    if (*numel > kMaxElementsPerValue) return false;
  }
  return true;
}

void EvaluateSmall(const Graph& graph, uint64_t seed) {
  SplitMix rng(seed);
  std::vector<int64_t> symbols;
  if (!ChooseSymbols(graph, rng, &symbols)) return;
  int64_t total = 0;
  std::vector<std::vector<int64_t>> value_sizes(graph.values.size());
  for (size_t v = 0; v < graph.values.size(); ++v) {
    int64_t numel = 0;
    if (!ConcreteSizes(graph.values[v].type.sizes, symbols, &value_sizes[v],
                       &numel)) {
      return;
    }
    total += numel;
    if (total > kMaxElementsTotal) return;
  }

  std::vector<HostTensor> inputs;
  for (const GraphInput& in : graph.inputs) {
    const TensorType& type = graph.type(in.value);
    const std::vector<int64_t>& sizes = value_sizes[in.value];
    std::vector<int64_t> strides;
    int64_t storage = 1;
    bool empty = false;
    for (size_t d = 0; d < sizes.size(); ++d) {
      const int64_t s =
          d < in.strides.size() ? in.strides[d].Evaluate(symbols) : int64_t{0};
      if (s < 0 || s > kMaxStorage) return;
      strides.push_back(s);
      if (sizes[d] == 0) empty = true;
      if (sizes[d] > 0) storage += (sizes[d] - 1) * s;
      if (storage > kMaxStorage) return;
    }
    if (in.strides.size() != sizes.size()) {
      // Import fills strides in; were it not to, run contiguous.
      strides.clear();
      int64_t s = 1;
      strides.resize(sizes.size());
      for (int d = static_cast<int>(sizes.size()) - 1; d >= 0; --d) {
        strides[d] = s;
        s *= sizes[d] > 0 ? sizes[d] : 1;
      }
      storage = s;
    }
    // A small offset, as a real caller's view into a larger buffer.
    const int64_t offset = in.storage_offset >= 0 && in.storage_offset < 64
                               ? in.storage_offset
                               : 0;
    HostTensor t = HostTensor::Strided(type.dtype, sizes, strides, offset,
                                       offset + (empty ? 1 : storage));
    for (int64_t i = 0; i < t.numel(); ++i) {
      const uint64_t r = rng.Next();
      if (IsFloating(type.dtype)) {
        // Quarter steps in [-4, 4], and now and then a special value.
        const int special = static_cast<int>(r >> 60);
        const double v =
            special == 0 ? std::numeric_limits<double>::quiet_NaN()
            : special == 1
                ? std::numeric_limits<double>::infinity()
                : static_cast<double>(static_cast<int>(r % 33) - 16) / 4.0;
        t.SetDoubleAt(i, v);
      } else if (type.dtype == DType::kBool) {
        t.SetIntAt(i, static_cast<int64_t>(r & 1));
      } else {
        t.SetIntAt(i, static_cast<int64_t>(r % 11) - 5);
      }
    }
    inputs.push_back(std::move(t));
  }

  absl::StatusOr<std::vector<HostTensor>> outputs =
      EvaluateReference(graph, inputs);
  if (!outputs.ok()) {
    // Inputs built from the graph's own metadata must be accepted.
    Fail("EvaluateReference rejected inputs made to the graph's metadata",
         outputs.status().ToString() + "\n" + graph.ToString());
  }
  if (outputs->size() != graph.outputs.size()) {
    Fail("EvaluateReference returned the wrong number of outputs",
         graph.ToString());
  }
  for (size_t i = 0; i < outputs->size(); ++i) {
    const ValueId v = graph.outputs[i];
    const HostTensor& out = (*outputs)[i];
    if (out.dtype() != graph.type(v).dtype || out.sizes() != value_sizes[v]) {
      Fail("an output's dtype or sizes differ from the inferred type",
           "output " + std::to_string(i) + ": " + out.ToString(4) + "\n" +
               graph.ToString());
    }
  }
}

std::string KeyHex(const Graph& graph, const v1::CompileRequest& request) {
  return DigestToHex(
      ComputeGuardKey(graph, request.target(), request.options()));
}

void Exercise(const v1::CompileRequest& request, uint64_t seed) {
  absl::StatusOr<Graph> graph = ImportGraph(request.graph());
  // The target is checked for its error path; the key is computed for any
  // graph that imports, since it must not depend on the target being valid.
  (void)ValidateTarget(request.target());
  if (!graph.ok()) {
    if (graph.status().message().empty()) {
      Fail("ImportGraph failed without a message", request.DebugString());
    }
    return;
  }
  (void)graph->ToString();

  const std::vector<KeyComponent> components =
      ExplainKey(*graph, request.target(), request.options());
  for (const KeyComponent& c : components) {
    if (c.hash != Sha256(c.canonical)) Fail("component hash", c.name);
  }
  const GuardKey key =
      ComputeGuardKey(*graph, request.target(), request.options());
  if (key != CombineKeyComponents(components)) {
    Fail("ComputeGuardKey != CombineKeyComponents(ExplainKey)", "");
  }

  // The same request spelled differently must import and give the same key.
  v1::CompileRequest rewritten = request;
  *rewritten.mutable_graph() = graph_gen::RenameSymbols(
      graph_gen::RenameValues(graph_gen::ShuffleNodes(request.graph(), seed),
                              seed),
      seed);
  absl::StatusOr<Graph> again = ImportGraph(rewritten.graph());
  if (!again.ok()) {
    Fail("a renamed/reordered valid graph does not import",
         again.status().ToString() + "\n" + rewritten.graph().DebugString());
  }
  if (KeyHex(*again, rewritten) != DigestToHex(key)) {
    std::string detail;
    for (const auto* g : {&*graph, &*again}) {
      for (const KeyComponent& c :
           ExplainKey(*g, request.target(), request.options())) {
        detail += "== " + c.name + "\n" + c.canonical + "\n";
      }
      detail += "---------\n";
    }
    Fail("renaming/reordering changed the key", detail);
  }

  EvaluateSmall(*graph, seed);
}

// Structure-aware mode: a random valid graph from tests/unit/graph_gen.h,
// then a few targeted edits driven by the input (a size, an op, an argument,
// strides, symbol facts, outputs). Byte mutations of whole requests mostly
// stop at the first malformed field; this reaches shape inference, dtype
// rules and the evaluator with graphs that are nearly valid.
void MutateGenerated(FuzzedDataProvider& fdp, v1::Graph* g) {
  static const std::vector<std::string> kOpNames = OpSignatures::Get().Names();
  const std::vector<std::string>* const kOps = &kOpNames;
  const std::vector<std::string> kStrings = {"none", "tanh", "floor", "trunc",
                                             ""};
  auto pick_value_name = [&]() -> std::string {
    std::vector<std::string> names;
    for (const v1::Input& in : g->inputs()) names.push_back(in.name());
    for (const v1::Node& n : g->nodes()) {
      for (const std::string& o : n.outputs()) names.push_back(o);
    }
    return names[fdp.ConsumeIntegralInRange<size_t>(0, names.size() - 1)];
  };
  auto random_int = [&]() -> int64_t {
    switch (fdp.ConsumeIntegralInRange(0, 3)) {
      case 0:
        return fdp.ConsumeIntegralInRange<int64_t>(-4, 8);
      case 1:
        return fdp.ConsumeIntegralInRange<int64_t>(0, 1 << 20);
      default:
        return fdp.ConsumeIntegral<int64_t>();
    }
  };
  auto random_argument = [&](v1::Argument* a) {
    switch (fdp.ConsumeIntegralInRange(0, 9)) {
      case 0:
        a->set_ref(pick_value_name());
        break;
      case 1:
        a->set_i(random_int());
        break;
      case 2:
        a->set_f(fdp.ConsumeFloatingPoint<double>());
        break;
      case 3:
        a->set_b(fdp.ConsumeBool());
        break;
      case 4: {
        v1::IntList* l = a->mutable_ints();
        for (int n = fdp.ConsumeIntegralInRange(0, 4); n > 0; --n) {
          l->add_values(random_int());
        }
        break;
      }
      case 5: {
        v1::DimList* l = a->mutable_dims();
        for (int n = fdp.ConsumeIntegralInRange(0, 4); n > 0; --n) {
          v1::Dim* d = l->add_values();
          if (fdp.ConsumeBool() && g->symbols_size() > 0) {
            d->set_symbol(
                g->symbols(fdp.ConsumeIntegralInRange(0, g->symbols_size() - 1))
                    .name());
          } else {
            d->set_value(random_int());
          }
        }
        break;
      }
      case 6: {
        v1::ValueList* l = a->mutable_refs();
        for (int n = fdp.ConsumeIntegralInRange(0, 3); n > 0; --n) {
          l->add_values(pick_value_name());
        }
        break;
      }
      case 7:
        a->set_dtype(static_cast<v1::DType>(fdp.ConsumeIntegralInRange(0, 7)));
        break;
      case 8:
        a->set_str(kStrings[fdp.ConsumeIntegralInRange<size_t>(
            0, kStrings.size() - 1)]);
        break;
      default:
        a->mutable_none();
        break;
    }
  };
  for (int edits = fdp.ConsumeIntegralInRange(0, 4); edits > 0; --edits) {
    v1::Node* node =
        g->mutable_nodes(fdp.ConsumeIntegralInRange(0, g->nodes_size() - 1));
    v1::Input* input =
        g->mutable_inputs(fdp.ConsumeIntegralInRange(0, g->inputs_size() - 1));
    switch (fdp.ConsumeIntegralInRange(0, 8)) {
      case 0:  // a size
        if (input->meta().sizes_size() > 0) {
          input->mutable_meta()
              ->mutable_sizes(
                  fdp.ConsumeIntegralInRange(0, input->meta().sizes_size() - 1))
              ->set_value(random_int());
        }
        break;
      case 1:  // another op with the same arguments
        node->set_op(
            (*kOps)[fdp.ConsumeIntegralInRange<size_t>(0, kOps->size() - 1)]);
        break;
      case 2:  // an argument replaced
        if (node->args_size() > 0) {
          random_argument(node->mutable_args(
              fdp.ConsumeIntegralInRange(0, node->args_size() - 1)));
        }
        break;
      case 3: {  // an argument added, positional or by a schema name
        v1::Argument* a = node->add_args();
        const OpSignature* op = OpSignatures::Get().Find(node->op());
        if (op != nullptr && !op->schema.empty() && fdp.ConsumeBool()) {
          a->set_name(op->schema[fdp.ConsumeIntegralInRange<size_t>(
                                     0, op->schema.size() - 1)]
                          .name);
        }
        random_argument(a);
        break;
      }
      case 4: {  // strides
        v1::TensorMeta* meta = input->mutable_meta();
        meta->clear_strides();
        for (int d = 0; d < meta->sizes_size(); ++d) {
          v1::Stride* st = meta->add_strides();
          st->set_value(fdp.ConsumeBool()
                            ? fdp.ConsumeIntegralInRange<int64_t>(-2, 64)
                            : random_int());
          if (fdp.ConsumeBool() && g->symbols_size() > 0) {
            st->add_symbols(g->symbols(0).name());
          }
        }
        break;
      }
      case 5:  // symbol facts
        if (g->symbols_size() > 0) {
          v1::Symbol* sym = g->mutable_symbols(
              fdp.ConsumeIntegralInRange(0, g->symbols_size() - 1));
          sym->set_max_value(random_int());
          sym->set_multiple_of(random_int());
        }
        break;
      case 6:  // a dtype
        input->mutable_meta()->set_dtype(
            static_cast<v1::DType>(fdp.ConsumeIntegralInRange(0, 7)));
        break;
      case 7:  // an extra output, maybe an input or a repeat
        g->add_outputs(pick_value_name());
        break;
      default:  // an argument removed
        if (node->args_size() > 0) node->mutable_args()->RemoveLast();
        break;
    }
  }
}

void FuzzGenerated(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  graph_gen::GraphGenOptions options;
  options.max_inputs = fdp.ConsumeIntegralInRange(1, 4);
  options.max_nodes = fdp.ConsumeIntegralInRange(1, 24);
  options.max_rank = fdp.ConsumeIntegralInRange(1, 4);
  options.max_symbols = fdp.ConsumeIntegralInRange(0, 3);
  options.reductions = fdp.ConsumeBool();
  options.dtypes.clear();
  const uint8_t dtype_mask = fdp.ConsumeIntegral<uint8_t>();
  for (int d = 1; d <= 6; ++d) {
    if (dtype_mask & (1 << d)) {
      options.dtypes.push_back(static_cast<v1::DType>(d));
    }
  }
  if (options.dtypes.empty()) options.dtypes.push_back(v1::FLOAT32);
  const uint64_t seed = fdp.ConsumeIntegral<uint64_t>();
  v1::CompileRequest request;
  *request.mutable_graph() = graph_gen::RandomGraph(seed, options);
  MutateGenerated(fdp, request.mutable_graph());
  if (fdp.ConsumeBool()) {
    request.mutable_target()->mutable_cuda()->set_arch("sm_90");
  } else {
    request.mutable_target()->mutable_cpu()->set_triple(
        "x86_64-unknown-linux-gnu");
  }
  request.mutable_options()->set_fast_math(fdp.ConsumeBool());
  Exercise(request, seed);
}

bool LooksLikeJson(absl::string_view input) {
  for (char c : input) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') continue;
    return c == '{';
  }
  return false;
}

}  // namespace
}  // namespace kiln

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Protobuf logs every invalid UTF-8 string it rejects; at a thousand
  // executions a second that drowns libFuzzer's own output.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  // Seed for evaluation and rewrites: a hash of the input (FNV-1a).
  uint64_t seed = 0xcbf29ce484222325ull;
  for (unsigned char c : input) seed = (seed ^ c) * 0x100000001b3ull;

  // "GEN" selects the structure-aware mode (seeds/gen_*).
  if (size >= 3 && input.substr(0, 3) == "GEN") {
    kiln::FuzzGenerated(data + 3, size - 3);
    return 0;
  }
  kiln::v1::CompileRequest request;
  if (request.ParseFromArray(data, static_cast<int>(size))) {
    kiln::Exercise(request, seed);
  }
  if (kiln::LooksLikeJson(input)) {
    const std::string text(input);
    kiln::v1::CompileRequest from_json;
    // A graph file (the seeds) gets a CPU target; a whole request its own.
    if (google::protobuf::util::JsonStringToMessage(text,
                                                    from_json.mutable_graph())
            .ok()) {
      from_json.mutable_target()->mutable_cpu()->set_triple(
          "x86_64-unknown-linux-gnu");
      from_json.mutable_target()->mutable_cpu()->set_cpu("x86-64-v3");
      kiln::Exercise(from_json, seed);
    } else {
      from_json.Clear();
      if (google::protobuf::util::JsonStringToMessage(text, &from_json).ok()) {
        kiln::Exercise(from_json, seed);
      }
    }
  }
  return 0;
}
