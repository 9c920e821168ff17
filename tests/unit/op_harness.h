// Test harness for single-op graphs: builds a kiln.v1.Graph with one node
// over given HostTensor inputs, imports it (validation, shapes, dtypes) and
// runs the reference evaluator.
//
//   auto r = RunOp("aten.add.Tensor", {F32({2}, {1, 2}), F32({2}, {3, 4})},
//                  {In(0), In(1), Kw("alpha", I(2))});
//   ASSERT_TRUE(r.ok()) << r.status();
//   EXPECT_EQ(r->outputs[0].GetDoubleAt(1), 10);
#ifndef KILN_TESTS_UNIT_OP_HARNESS_H_
#define KILN_TESTS_UNIT_OP_HARNESS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "graph/graph.h"
#include "graph/host_tensor.h"
#include "graph/import.h"
#include "graph/op_signature.h"
#include "compiler/reference.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::testing {

// ---- tensors ----
inline HostTensor MakeTensor(DType dtype, std::vector<int64_t> sizes, const std::vector<double>& values) {
  HostTensor t = HostTensor::Empty(dtype, std::move(sizes));
  for (int64_t i = 0; i < t.numel() && i < static_cast<int64_t>(values.size()); ++i) {
    if (IsFloating(dtype)) t.SetDoubleAt(i, values[i]);
    else t.SetIntAt(i, static_cast<int64_t>(values[i]));
  }
  return t;
}
inline HostTensor F32(std::vector<int64_t> s, const std::vector<double>& v) { return MakeTensor(DType::kFloat32, std::move(s), v); }
inline HostTensor F16(std::vector<int64_t> s, const std::vector<double>& v) { return MakeTensor(DType::kFloat16, std::move(s), v); }
inline HostTensor BF16(std::vector<int64_t> s, const std::vector<double>& v) { return MakeTensor(DType::kBFloat16, std::move(s), v); }
inline HostTensor I32(std::vector<int64_t> s, const std::vector<double>& v) { return MakeTensor(DType::kInt32, std::move(s), v); }
inline HostTensor I64(std::vector<int64_t> s, const std::vector<double>& v) { return MakeTensor(DType::kInt64, std::move(s), v); }
inline HostTensor Bool(std::vector<int64_t> s, const std::vector<double>& v) { return MakeTensor(DType::kBool, std::move(s), v); }

// The transpose of a contiguous [rows, cols] tensor as a non-contiguous
// [cols, rows] view: element (i, j) of the result is values[j * cols + i].
inline HostTensor TransposedView(const HostTensor& t) {
  return HostTensor::View(t, {t.sizes()[1], t.sizes()[0]}, {t.strides()[1], t.strides()[0]}, t.offset());
}

// All elements in row-major order, as doubles.
inline std::vector<double> Values(const HostTensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.GetDoubleAt(i));
  return v;
}

// ---- arguments ----
inline v1::Argument In(int i) { v1::Argument a; a.set_ref(absl::StrCat("x", i)); return a; }
inline v1::Argument I(int64_t v) { v1::Argument a; a.set_i(v); return a; }
inline v1::Argument F(double v) { v1::Argument a; a.set_f(v); return a; }
inline v1::Argument B(bool v) { v1::Argument a; a.set_b(v); return a; }
inline v1::Argument S(std::string v) { v1::Argument a; a.set_str(std::move(v)); return a; }
inline v1::Argument NoneArg() { v1::Argument a; a.mutable_none(); return a; }
inline v1::Argument DT(v1::DType d) { v1::Argument a; a.set_dtype(d); return a; }
inline v1::Argument Ints(std::vector<int64_t> v) {
  v1::Argument a;
  a.mutable_ints();  // set even when empty: Ints({}) is the list [], not unset
  for (int64_t x : v) a.mutable_ints()->add_values(x);
  return a;
}
inline v1::Argument Refs(std::vector<int> inputs) {
  v1::Argument a;
  for (int i : inputs) a.mutable_refs()->add_values(absl::StrCat("x", i));
  return a;
}
inline v1::Argument Kw(std::string name, v1::Argument a) { a.set_name(std::move(name)); return a; }

// ---- graphs ----
inline v1::TensorMeta MetaOf(const HostTensor& t) {
  v1::TensorMeta m;
  m.set_dtype(static_cast<v1::DType>(t.dtype()));
  for (int64_t s : t.sizes()) m.add_sizes()->set_value(s);
  m.set_device(v1::CPU);
  return m;
}

// A graph with inputs x0..xn (static metadata of `inputs`), one node `op`
// with outputs y0..yk, returning all outputs: the op's number of outputs,
// or `num_outputs` when given (needed for ops whose count depends on their
// arguments, as split).
inline v1::Graph OneOpGraph(const std::string& op,
                            const std::vector<HostTensor>& inputs,
                            const std::vector<v1::Argument>& args,
                            int num_outputs = -1) {
  v1::Graph g;
  for (size_t i = 0; i < inputs.size(); ++i) {
    v1::Input* in = g.add_inputs();
    in->set_name(absl::StrCat("x", i));
    *in->mutable_meta() = MetaOf(inputs[i]);
  }
  v1::Node* node = g.add_nodes();
  node->set_op(op);
  for (const v1::Argument& a : args) *node->add_args() = a;
  const OpSignature* def = OpSignatures::Get().Find(op);
  const int outputs = num_outputs >= 0 ? num_outputs
                      : def            ? def->num_outputs
                                       : 1;
  for (int o = 0; o < outputs; ++o) {
    node->add_outputs(absl::StrCat("y", o));
    g.add_outputs(absl::StrCat("y", o));
  }
  return g;
}

struct OpResult {
  Graph graph;
  std::vector<HostTensor> outputs;
  // Inferred type of output o.
  const TensorType& type(int o = 0) const { return graph.type(graph.outputs[o]); }
  // Static sizes of output o (fails the test via -1 for symbolic sizes).
  std::vector<int64_t> sizes(int o = 0) const {
    std::vector<int64_t> s;
    for (const SymExpr& e : type(o).sizes) s.push_back(e.AsConstant().value_or(-1));
    return s;
  }
};

inline absl::StatusOr<OpResult> RunOp(const std::string& op,
                                      const std::vector<HostTensor>& inputs,
                                      const std::vector<v1::Argument>& args,
                                      int num_outputs = -1) {
  auto graph = ImportGraph(OneOpGraph(op, inputs, args, num_outputs));
  if (!graph.ok()) return graph.status();
  auto outs = EvaluateReference(*graph, inputs);
  if (!outs.ok()) return outs.status();
  return OpResult{*std::move(graph), *std::move(outs)};
}

}  // namespace kiln::testing

#endif  // KILN_TESTS_UNIT_OP_HARNESS_H_
