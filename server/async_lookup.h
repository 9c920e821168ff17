// AsyncLookupServer: serves KilnService's Lookup through gRPC's async
// (completion-queue) API, each of its threads looping on its own
// ServerCompletionQueue and answering the calls that queue delivers inline
// (KilnService::LookupBytes: a hit from the hot cache, never a compile), so
// that the thread gRPC woke for a request sends its response.
//
// Use (the service made with KilnServiceOptions::async_lookup):
//   AsyncLookupServer lookups(&service, threads, &builder);  // before Build
//   server = builder.BuildAndStart();
//   lookups.Start();
//   ... server->Shutdown(); lookups.Shutdown();
// Declare it before the grpc::Server, so that the server goes first.
//
// Thread-safety: Start and Shutdown from one thread.
#ifndef KILN_SERVER_ASYNC_LOOKUP_H_
#define KILN_SERVER_ASYNC_LOOKUP_H_

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "grpcpp/server_builder.h"
#include "server/kiln_service.h"

namespace kiln {

class AsyncLookupServer {
 public:
  // Calls each queue has requested at any time (one more is requested as
  // each arrives).
  static constexpr int kCallsPerQueue = 16;

  // Adds `threads` (>= 1) completion queues to `builder`.
  AsyncLookupServer(KilnService* service, int threads,
                    grpc::ServerBuilder* builder);
  // Shutdown().
  ~AsyncLookupServer();

  AsyncLookupServer(const AsyncLookupServer&) = delete;
  AsyncLookupServer& operator=(const AsyncLookupServer&) = delete;

  // After BuildAndStart: requests the first calls, starts the threads.
  void Start();
  // After grpc::Server::Shutdown: shuts the queues down, drains them and
  // joins the threads. Idempotent.
  void Shutdown();

 private:
  class Call;
  static void Serve(grpc::ServerCompletionQueue* cq);

  KilnService* const service_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs_;
  std::vector<std::thread> threads_;
  // Set before the queues shut down: no call is requested after.
  std::atomic<bool> stopping_{false};
  bool shut_down_ = false;
};

}  // namespace kiln

#endif  // KILN_SERVER_ASYNC_LOOKUP_H_
