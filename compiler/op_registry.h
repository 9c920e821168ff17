// The op registry: one entry per supported Core ATen overload, holding its
// argument schema, shape rule, dtype rule and reference semantics (the
// lowering joins the same entry with the code generators). Adding an op
// means adding one entry in one of compiler/ops_*.cc.
//
// The registry is built once, on first use, and is immutable afterwards.
// Thread-safety: lookups are safe from any thread.
#ifndef KILN_COMPILER_OP_REGISTRY_H_
#define KILN_COMPILER_OP_REGISTRY_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "compiler/graph.h"
#include "compiler/host_tensor.h"
#include "compiler/lower.h"

namespace kiln {

// What an argument position accepts (ATen schema types).
enum class ArgKind : uint8_t {
  kTensor,           // Tensor
  kOptionalTensor,   // Tensor?
  kTensorOrScalar,   // Tensor, where a Python number is also accepted (a
                     // wrapped number, as aten.add.Tensor(x, 0.5) in FX)
  kScalar,           // Scalar
  kOptionalScalar,   // Scalar?
  kInt,              // int / SymInt
  kOptionalInt,      // int?
  kIntList,          // int[] / SymInt[] (dims or ints)
  kOptionalIntList,  // int[]?  (None, or a list)
  kBool,
  kFloat,           // float (an int is accepted and converted)
  kOptionalFloat,   // float?
  kOptionalDType,   // ScalarType?
  kString,          // str
  kOptionalString,  // str?
  kTensorList,      // Tensor[]
  kIgnored,         // layout / device / pin_memory / memory_format /
                    // non_blocking: accepted and ignored, Kiln picks layouts
};

struct ArgSpec {
  std::string name;
  ArgKind kind;
  // Default when not given; none means the argument is required.
  std::optional<Attr> default_value;
  bool kwarg_only = false;
};

// What shape and dtype rules see: the node's bound arguments and the types
// of the values they refer to.
class OpContext {
 public:
  OpContext(const Graph& graph, const Node& node, int node_index)
      : graph_(graph), node_(node), node_index_(node_index) {}

  const Attr& arg(int i) const { return node_.args[i]; }
  const TensorType& type(int i) const {
    return graph_.type(node_.args[i].tensor);
  }
  const TensorType& value_type(ValueId v) const { return graph_.type(v); }
  bool is_tensor(int i) const {
    return node_.args[i].kind == Attr::Kind::kTensor;
  }
  const Graph& graph() const { return graph_; }
  const Node& node() const { return node_; }
  int node_index() const { return node_index_; }

  // INVALID_ARGUMENT naming the node and op: "node 3 (aten.sum.dim_IntList):
  // <msg>".
  absl::Status Invalid(absl::string_view message) const;

  // Normalises a possibly negative dim against `rank` (PyTorch's
  // maybe_wrap_dim: rank 0 accepts -1 and 0).
  absl::StatusOr<int> WrapDim(int64_t dim, int rank) const;

 private:
  const Graph& graph_;
  const Node& node_;
  int node_index_;
};

using ShapeRule =
    std::function<absl::StatusOr<std::vector<std::vector<SymExpr>>>(
        const OpContext&)>;
using DTypeRule =
    std::function<absl::StatusOr<std::vector<DType>>(const OpContext&)>;

// What reference semantics see: arguments with tensors as HostTensors, the
// output types (dtypes, and sizes already evaluated to concrete values).
struct RefContext {
  const Node& node;
  std::vector<HostTensor> tensors;  // tensors[i] is argument i if a tensor
  std::vector<std::vector<HostTensor>> tensor_lists;  // for Tensor[] args
  std::vector<DType> out_dtypes;
  std::vector<std::vector<int64_t>> out_sizes;
  const Attr& arg(int i) const { return node.args[i]; }
};
using ReferenceFn =
    std::function<absl::StatusOr<std::vector<HostTensor>>(const RefContext&)>;

// Lowering to the loop IR: the op's values as loop nodes and index maps.
using LowerFn = std::function<absl::StatusOr<std::vector<LoweredValue>>(LowerContext&)>;

// The op's category, which later stages (fusion) use.
enum class OpClass : uint8_t {
  kPointwise,
  kReduction,
  kView,
  kComposite,
  kCreation,
  kData
};

struct OpDef {
  std::string name;  // ATen overload name, e.g. "aten.add.Tensor"
  OpClass op_class = OpClass::kPointwise;
  std::vector<ArgSpec> schema;
  int num_outputs = 1;
  ShapeRule shape;
  DTypeRule dtype;
  ReferenceFn reference;
  LowerFn lower;
};

class OpRegistry {
 public:
  // The process-wide registry, built on first call.
  static const OpRegistry& Get();

  // nullptr when `name` is not supported.
  const OpDef* Find(absl::string_view name) const;
  std::vector<std::string> Names() const;  // sorted

  // Registration, used only while building.
  void Add(OpDef def);

 private:
  absl::flat_hash_map<std::string, std::unique_ptr<OpDef>> ops_;
};

// Per-family registration, one per compiler/ops_*.cc.
void RegisterPointwiseOps(OpRegistry& registry);
void RegisterReductionOps(OpRegistry& registry);
void RegisterShapeOps(OpRegistry& registry);
void RegisterCompositeOps(OpRegistry& registry);

}  // namespace kiln

#endif  // KILN_COMPILER_OP_REGISTRY_H_
