// runtime/per_context.h without a GPU: contexts are opaque pointers there.
#include "runtime/per_context.h"

#include <memory>

#include "gtest/gtest.h"

namespace kiln {
namespace {

struct Handle {
  explicit Handle(int* alive) : alive(alive) { ++*alive; }
  ~Handle() { --*alive; }
  int* alive;
};

cuda::Context FakeContext(uintptr_t n) {
  return reinterpret_cast<cuda::Context>(n);
}

TEST(SharedPerContext, OnePerContextWhileHeld) {
  int alive = 0, made = 0;
  auto make = [&]() -> absl::StatusOr<std::unique_ptr<Handle>> {
    ++made;
    return std::make_unique<Handle>(&alive);
  };
  auto a = SharedPerContext<Handle>(FakeContext(16), make);
  auto b = SharedPerContext<Handle>(FakeContext(16), make);
  auto c = SharedPerContext<Handle>(FakeContext(32), make);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->get(), b->get()) << "one per context";
  EXPECT_NE(a->get(), c->get()) << "another context, another object";
  EXPECT_EQ(made, 2);
  EXPECT_EQ(alive, 2);
  a->reset();
  EXPECT_EQ(alive, 2) << "b still holds it";
  b->reset();
  EXPECT_EQ(alive, 1) << "gone with its last holder";
  auto d = SharedPerContext<Handle>(FakeContext(16), make);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(made, 3) << "a fresh one after the last let go";
  EXPECT_EQ(alive, 2);
}

TEST(SharedPerContext, AFailedMakeIsReturnedAndNotKept) {
  int alive = 0;
  bool fail = true;
  auto make = [&]() -> absl::StatusOr<std::unique_ptr<Handle>> {
    if (fail) return absl::FailedPreconditionError("no library");
    return std::make_unique<Handle>(&alive);
  };
  auto a = SharedPerContext<Handle>(FakeContext(48), make);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  fail = false;
  auto b = SharedPerContext<Handle>(FakeContext(48), make);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(alive, 1);
}

}  // namespace
}  // namespace kiln
