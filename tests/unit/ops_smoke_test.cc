// A few end-to-end checks of the harness itself; the per-op suites live in
// ops_*_test.cc.
#include <cmath>

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

}  // namespace
}  // namespace kiln::testing
