// The service's single-flight machinery: a caller that gives up does not
// cancel the compile for the others; the compile queue is bounded; the pool
// drains on shutdown. KilnService runs in-process on a real gRPC server on
// an ephemeral loopback port over a real ArtifactStore.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <latch>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cache/artifact_store.h"
#include "compiler/cpu_backend.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/activity_tracker.h"
#include "server/compile_pool.h"
#include "server/inflight_compiles.h"
#include "server/kiln_service.h"

namespace kiln {
namespace {

TEST(InflightCompiles, FirstLeadsOthersJoinAllGetTheResult) {
  InflightCompiles inflight;
  Sha256Digest key = Sha256("k");
  auto a = inflight.Join(key);
  auto b = inflight.Join(key);
  EXPECT_TRUE(a.leader);
  EXPECT_FALSE(b.leader);
  EXPECT_EQ(inflight.size(), 1u);
  inflight.Finish(key, absl::InternalError("boom"));
  EXPECT_EQ(a.result.get().status().message(), "boom");
  EXPECT_EQ(b.result.get().status().message(), "boom");
  EXPECT_EQ(inflight.size(), 0u);
  EXPECT_TRUE(inflight.Join(key).leader);  // a new flight after Finish
}

TEST(CompilePool, RefusesPastTheQueueBoundAndDrainsOnDestruction) {
  std::atomic<int> ran{0};
  std::latch started(1), release(1);
  {
    CompilePool pool(/*threads=*/1, /*max_queue=*/2);
    ASSERT_TRUE(pool.Submit([&] {
      started.count_down();
      release.wait();
      ++ran;
    }));
    started.wait();  // the only thread is busy now
    EXPECT_TRUE(pool.Submit([&] { ++ran; }));
    EXPECT_TRUE(pool.Submit([&] { ++ran; }));
    EXPECT_FALSE(pool.Submit([&] { ++ran; }));  // queue full
    EXPECT_EQ(pool.queue_depth(), 2u);
    release.count_down();
  }  // destruction drains the queue
  EXPECT_EQ(ran.load(), 3);
}

class ServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("service_test_", getpid(), "_", rand());
    ArtifactStoreOptions o;
    o.data_dir = dir_.string();
    auto store = ArtifactStore::Open(o);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    KilnServiceOptions so;
    so.compile_threads = 1;
    service_ = std::make_unique<KilnService>(store_.get(), so);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_GT(port_, 0);
    stub_ = v1::Kiln::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port_), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    server_->Shutdown();
    service_->Drain();
    service_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  grpc::Status Compile(const v1::CompileRequest& req, v1::CompileResponse* resp,
                       std::chrono::milliseconds deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    return stub_->Compile(&ctx, req, resp);
  }

  std::filesystem::path dir_;
  std::unique_ptr<ArtifactStore> store_;
  std::unique_ptr<KilnService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<v1::Kiln::Stub> stub_;
};

// A pointwise chain long enough that compiling it takes far longer than the
// deadline below, which itself is far longer than a loopback round trip.
v1::CompileRequest SlowRequest(int length) {
  v1::CompileRequest req;
  v1::Graph* g = req.mutable_graph();
  auto* in = g->add_inputs();
  in->set_name("x0");
  in->mutable_meta()->set_dtype(v1::FLOAT32);
  in->mutable_meta()->add_sizes()->set_value(64);
  for (int i = 0; i < length; ++i) {
    auto* node = g->add_nodes();
    node->add_args()->set_ref(absl::StrCat("x", i));
    if (i % 2) {
      node->set_op("aten.sin.default");
    } else {
      node->set_op("aten.add.Tensor");
      node->add_args()->set_f(0.01 * i);
    }
    node->add_outputs(absl::StrCat("x", i + 1));
  }
  g->add_outputs(absl::StrCat("x", length));
  *req.mutable_target()->mutable_cpu() = HostCpuTarget();
  return req;
}

TEST_F(ServiceTest, ACallerThatGivesUpDoesNotCancelTheCompile) {
  const v1::CompileRequest req = SlowRequest(3000);
  v1::CompileResponse resp;
  grpc::Status s = Compile(req, &resp, std::chrono::milliseconds(300));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << s.error_message();
  // The compile went on and lands in the cache: a later request joins it or
  // hits, and nothing compiles twice.
  v1::CompileResponse later;
  ASSERT_TRUE(Compile(req, &later, std::chrono::seconds(120)).ok());
  EXPECT_NE(later.outcome(), v1::CompileResponse::COMPILED);
  EXPECT_GT(later.compile_seconds(),
            0.3);  // the premise: slower than the deadline
  grpc::ClientContext ctx;
  v1::Stats stats;
  ASSERT_TRUE(stub_->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
  EXPECT_EQ(stats.compiles(), 1u);
  EXPECT_EQ(stats.entries(), 1u);
}

TEST(ActivityTracker, IdleOnlyWhileNoRpcIsInFlight) {
  using Clock = ActivityTracker::Clock;
  using std::chrono::seconds;
  const Clock::time_point t0 = Clock::now();
  ActivityTracker tracker(t0);
  EXPECT_EQ(tracker.IdleFor(t0 + seconds(5)), seconds(5));
  {
    ActivityTracker::Busy rpc = tracker.Begin();
    EXPECT_EQ(tracker.in_flight(), 1);
    // However long an RPC runs (a Compile), the daemon is not idle.
    EXPECT_EQ(tracker.IdleFor(Clock::now() + seconds(3600)),
              Clock::duration::zero());
    ActivityTracker::Busy moved = std::move(rpc);  // still one RPC
    EXPECT_EQ(tracker.in_flight(), 1);
  }
  const Clock::time_point ended = Clock::now();
  EXPECT_EQ(tracker.in_flight(), 0);
  // Idle counts from the end of the last RPC (just before `ended`), not
  // from t0.
  const Clock::duration idle = tracker.IdleFor(ended + seconds(10));
  EXPECT_GE(idle, seconds(10));
  EXPECT_LT(idle, seconds(11));
  // A time before the last end reads as not idle, never negative.
  EXPECT_EQ(tracker.IdleFor(t0), Clock::duration::zero());
}

TEST(ActivityTracker, ConcurrentRpcsKeepItBusyUntilTheLastEnds) {
  ActivityTracker tracker;
  std::vector<std::thread> threads;
  std::atomic<int> started{0};
  std::atomic<bool> release{false};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      ActivityTracker::Busy busy = tracker.Begin();
      started.fetch_add(1);
      while (!release.load()) std::this_thread::yield();
    });
  }
  while (started.load() < 8) std::this_thread::yield();
  EXPECT_EQ(tracker.in_flight(), 8);
  EXPECT_EQ(tracker.IdleFor(), ActivityTracker::Clock::duration::zero());
  release.store(true);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(tracker.in_flight(), 0);
  EXPECT_LT(tracker.IdleFor(), std::chrono::seconds(60));
}

}  // namespace
}  // namespace kiln
