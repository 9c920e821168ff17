// Kiln's in-memory graph: the validated, typed form of a kiln.v1.Graph.
//
// Every value has a dtype and sizes (SymExprs over the graph's symbols);
// every node's arguments are bound to its op's schema with defaults filled in.
// Graphs are functional: no op mutates or aliases observably, so view ops are
// value transformations here (the loop IR turns them into index maps).
//
// Built by ImportGraph (graph/import.h); read-only afterwards.
// Thread-safety: a const Graph may be read from many threads.
#ifndef KILN_GRAPH_GRAPH_H_
#define KILN_GRAPH_GRAPH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "graph/dtype.h"
#include "graph/sym_expr.h"

namespace kiln {

struct OpSignature;
using ValueId = int;

struct TensorType {
  DType dtype = DType::kFloat32;
  std::vector<SymExpr> sizes;

  int rank() const { return static_cast<int>(sizes.size()); }
  bool operator==(const TensorType&) const = default;
};

// A bound argument. Lists of ints and of SymInts are both `ints`.
struct Attr {
  enum class Kind : uint8_t {
    kNone,
    kTensor,
    kInt,
    kFloat,
    kBool,
    kInts,
    kTensors,
    kDType,
    kString
  };
  Kind kind = Kind::kNone;
  ValueId tensor = -1;
  int64_t i = 0;
  double f = 0;
  bool b = false;
  std::vector<SymExpr> ints;
  std::vector<ValueId> tensors;
  DType dtype = DType::kFloat32;
  std::string str;

  static Attr None() { return Attr{}; }
  static Attr Tensor(ValueId v) {
    Attr a;
    a.kind = Kind::kTensor;
    a.tensor = v;
    return a;
  }
  static Attr Int(int64_t v) {
    Attr a;
    a.kind = Kind::kInt;
    a.i = v;
    return a;
  }
  static Attr Float(double v) {
    Attr a;
    a.kind = Kind::kFloat;
    a.f = v;
    return a;
  }
  static Attr Bool(bool v) {
    Attr a;
    a.kind = Kind::kBool;
    a.b = v;
    return a;
  }
  static Attr Ints(std::vector<SymExpr> v) {
    Attr a;
    a.kind = Kind::kInts;
    a.ints = std::move(v);
    return a;
  }
  static Attr DTypeAttr(DType d) {
    Attr a;
    a.kind = Kind::kDType;
    a.dtype = d;
    return a;
  }
  static Attr String(std::string s) {
    Attr a;
    a.kind = Kind::kString;
    a.str = std::move(s);
    return a;
  }

  bool is_none() const { return kind == Kind::kNone; }
  // A Python number (int, float or bool Scalar).
  bool is_scalar() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  // The scalar as a double (ints and bools convert).
  double ScalarAsDouble() const {
    return kind == Kind::kFloat  ? f
           : kind == Kind::kBool ? (b ? 1 : 0)
                                 : static_cast<double>(i);
  }
  // The dtype class a Python scalar promotes as.
  DType ScalarKind() const {
    return kind == Kind::kFloat  ? DType::kFloat32
           : kind == Kind::kBool ? DType::kBool
                                 : DType::kInt64;
  }
};

struct Value {
  TensorType type;
  std::string name;   // the name in the request, for messages and dumps
  int producer = -1;  // node index, or -1 for a graph input
  int output_index = 0;
};

struct Node {
  const OpSignature* op = nullptr;  // graph/op_signature.h
  std::vector<Attr> args;  // in schema order, defaults filled in
  std::vector<ValueId> outputs;
};

enum class DeviceKind : uint8_t { kUnspecified = 0, kCpu = 1, kCuda = 2 };

struct GraphInput {
  ValueId value = -1;
  std::vector<SymExpr> strides;  // in elements, one per dim
  int64_t storage_offset = 0;
  int64_t alignment = 0;  // bytes; 0 = element-aligned only
  DeviceKind device = DeviceKind::kUnspecified;
};

struct SymbolInfo {
  std::string name;
  int64_t max_value = 0;    // 0: unbounded
  int64_t multiple_of = 1;  // 1: nothing known
};

// The smallest value a symbol can take (PyTorch's 0/1 specialisation).
inline constexpr int64_t kMinSymbolValue = 2;

// Graph output `output` is the new value of input `input` (v1::InputWrite).
struct InputWrite {
  int output = 0;
  int input = 0;
  bool operator==(const InputWrite&) const = default;
};

struct Graph {
  std::vector<SymbolInfo> symbols;
  std::vector<Value> values;
  std::vector<GraphInput> inputs;
  std::vector<Node> nodes;
  std::vector<ValueId> outputs;
  std::vector<InputWrite> input_writes;  // at most one per output and input

  const TensorType& type(ValueId v) const { return values[v].type; }
  std::vector<std::string> SymbolNames() const;
  // Each symbol's max_value (0: unbounded), by symbol id: what
  // SymExpr::NonNegativeWithin takes.
  std::vector<int64_t> SymbolMaxValues() const;
  // A readable listing, one line per input, node and output; the first
  // compiler stage's dump.
  std::string ToString() const;
};

// Contiguous (row-major) strides for `sizes`.
std::vector<SymExpr> ContiguousStrides(const std::vector<SymExpr>& sizes);
// Product of sizes.
SymExpr NumElements(const std::vector<SymExpr>& sizes);

}  // namespace kiln

#endif  // KILN_GRAPH_GRAPH_H_
