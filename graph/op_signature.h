// Op signatures: what the graph layer knows of each supported Core ATen
// overload — its argument schema, its class, and its shape and dtype rules.
// ImportGraph (import.h) binds a node's arguments to the schema and types
// its outputs with the rules; the guard key names arguments from the schema.
// What an op computes (reference semantics) and how it is compiled (its
// lowering) are the compiler's tables, keyed by the same name
// (compiler/op_reference.h, compiler/op_lowering.h): clients link this file
// and never the compiler.
//
// Adding an op: a named shape rule and dtype rule and one line in the table
// of its family in graph/ops/*.cc (pointwise, reduction, views, indexing,
// creation, composite, gather_scatter, sort ...), then its reference and
// lowering in the compiler's tables of the same family (compiler/ops/).
//
// The table is built once, on first use, and is immutable afterwards.
// Thread-safety: lookups are safe from any thread.
#ifndef KILN_GRAPH_OP_SIGNATURE_H_
#define KILN_GRAPH_OP_SIGNATURE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "graph/graph.h"
#include "graph/op_table.h"

namespace kiln {

// What an argument position accepts (ATen schema types).
enum class ArgKind : uint8_t {
  kTensor,           // Tensor
  kOptionalTensor,   // Tensor?
  kTensorOrScalar,   // Tensor, where a Python number is also accepted (a
                     // wrapped number, as aten.add.Tensor(x, 0.5) in FX)
  kScalar,           // Scalar
  kOptionalScalar,   // Scalar?
  kSymScalar,        // Scalar, or a SymInt over the graph's symbols given as
                     // a one-element size list (an Attr of kind kInts with
                     // one entry): arange's end, whose rules read it so
  kInt,              // int / SymInt
  kOptionalInt,      // int?
  kOptionalSymInt,   // SymInt?: None, an int, or a SymInt over the symbols
                     // given as a one-element size list (an Attr of kind
                     // kInts with one entry): slice's end
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

// One sizes list per output.
using Shapes = std::vector<std::vector<SymExpr>>;
using ShapeRule = std::function<absl::StatusOr<Shapes>(const OpContext&)>;
using DTypeRule =
    std::function<absl::StatusOr<std::vector<DType>>(const OpContext&)>;

// The op's category, which later stages (fusion) use.
enum class OpClass : uint8_t {
  kPointwise,
  kReduction,
  kView,
  kComposite,
  kCreation,
  kData,
  kExtern,  // computed by a vendor library (matrix products)
};

inline constexpr int kVariableOutputs = -1;

struct OpSignature {
  std::string name;  // ATen overload name, e.g. "aten.add.Tensor"
  OpClass op_class = OpClass::kPointwise;
  std::vector<ArgSpec> schema;
  // kVariableOutputs: as many as the shape rule returns for the node's
  // arguments (split, unbind); the node must define that many.
  int num_outputs = 1;
  ShapeRule shape;
  DTypeRule dtype;
};

// Find(name): nullptr when the op is not supported; Names(): sorted.
class OpSignatures : public OpTable<OpSignature> {
 public:
  // The process-wide table, built on first call.
  static const OpSignatures& Get();

  // Registration, used only while building; a name added twice aborts.
  void Add(OpSignature signature) {
    std::string name = signature.name;
    OpTable::Add(std::move(name), std::move(signature));
  }
};

// Per-family tables, one per graph/ops/*.cc.
void RegisterPointwiseSignatures(OpSignatures& table);
void RegisterReductionSignatures(OpSignatures& table);
void RegisterViewSignatures(OpSignatures& table);
void RegisterIndexingSignatures(OpSignatures& table);
void RegisterCreationSignatures(OpSignatures& table);
void RegisterCompositeSignatures(OpSignatures& table);
void RegisterMatmulSignatures(OpSignatures& table);
void RegisterNormSignatures(OpSignatures& table);
void RegisterPoolingSignatures(OpSignatures& table);
void RegisterConvSignatures(OpSignatures& table);
void RegisterAttentionSignatures(OpSignatures& table);
void RegisterGatherScatterSignatures(OpSignatures& table);
void RegisterRandomSignatures(OpSignatures& table);
void RegisterSortSignatures(OpSignatures& table);

}  // namespace kiln

#endif  // KILN_GRAPH_OP_SIGNATURE_H_
