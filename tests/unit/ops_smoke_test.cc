// A few end-to-end checks of the harness itself; the per-op suites live in
// ops_*_test.cc.
#include <cmath>

#include "compiler/op_lowering.h"
#include "compiler/op_reference.h"
#include "graph/op_signature.h"
#include "gtest/gtest.h"
#include "tests/unit/op_harness.h"

namespace kiln::testing {
namespace {

TEST(OpsSmoke, AddWithAlphaBroadcasts) {
  auto r =
      RunOp("aten.add.Tensor", {F32({2, 2}, {1, 2, 3, 4}), F32({2}, {10, 20})},
            {In(0), In(1), Kw("alpha", I(2))});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->type().dtype, DType::kFloat32);
  EXPECT_EQ(r->sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Values(r->outputs[0]), (std::vector<double>{21, 42, 23, 44}));
}

TEST(OpsSmoke, SumOverNonContiguousInput) {
  HostTensor base = F32({2, 3}, {1, 2, 3, 4, 5, 6});
  HostTensor t = TransposedView(base);  // [[1,4],[2,5],[3,6]]
  auto r = RunOp("aten.sum.dim_IntList", {t}, {In(0), Ints({-1})});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Values(r->outputs[0]), (std::vector<double>{5, 7, 9}));
}

TEST(OpsSmoke, UnknownOpIsUnimplemented) {
  auto r = RunOp("aten.foo.default", {F32({1}, {1})}, {In(0)});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("aten.foo.default"), std::string::npos);
}

// The three tables (graph/op_signature.h, compiler/op_reference.h,
// compiler/op_lowering.h) name the same ops: an op with a signature but no
// reference or lowering would import and then fail late.
TEST(OpsSmoke, SignatureReferenceAndLoweringTablesAgree) {
  const std::vector<std::string> signatures = OpSignatures::Get().Names();
  EXPECT_GT(signatures.size(), 100u);
  EXPECT_EQ(OpReferences::Get().Names(), signatures);
  EXPECT_EQ(OpLowerings::Get().Names(), signatures);
  for (const std::string& op : signatures) {
    const OpSignature* s = OpSignatures::Get().Find(op);
    ASSERT_NE(s, nullptr) << op;
    EXPECT_EQ(s->name, op);
    EXPECT_TRUE(s->shape) << op << " has no shape rule";
    EXPECT_TRUE(s->dtype) << op << " has no dtype rule";
    EXPECT_TRUE(*OpReferences::Get().Find(op)) << op;
    EXPECT_TRUE(*OpLowerings::Get().Find(op)) << op;
  }
}

}  // namespace
}  // namespace kiln::testing
