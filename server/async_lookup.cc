#include "server/async_lookup.h"

#include "grpcpp/support/async_unary_call.h"

namespace kiln {

// One Lookup call: requested, answered inline, then deleted once its
// response is sent. Its tag on the queue is itself.
class AsyncLookupServer::Call {
 public:
  Call(AsyncLookupServer* server, grpc::ServerCompletionQueue* cq)
      : server_(server), cq_(cq), writer_(&ctx_) {
    server_->service_->RequestLookup(&ctx_, &request_, &writer_, cq_, this);
  }

  // The event of this call's pending operation: the call's arrival, then
  // its Finish.
  void Proceed(bool ok) {
    if (answered_ || !ok) {  // sent (or cancelled), or the server shut down
      delete this;
      return;
    }
    if (!server_->stopping_.load(std::memory_order_acquire))
      new Call(server_, cq_);  // the queue's next call
    answered_ = true;
    grpc::Status status = server_->service_->LookupBytes(request_, &response_);
    if (status.ok()) {
      writer_.Finish(response_, status, this);
    } else {
      writer_.FinishWithError(status, this);
    }
  }

 private:
  AsyncLookupServer* const server_;
  grpc::ServerCompletionQueue* const cq_;
  grpc::ServerContext ctx_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> writer_;
  bool answered_ = false;
};

AsyncLookupServer::AsyncLookupServer(KilnService* service, int threads,
                                     grpc::ServerBuilder* builder)
    : service_(service) {
  for (int i = 0; i < std::max(1, threads); ++i)
    cqs_.push_back(builder->AddCompletionQueue());
}

AsyncLookupServer::~AsyncLookupServer() { Shutdown(); }

void AsyncLookupServer::Start() {
  for (auto& cq : cqs_) {
    for (int i = 0; i < kCallsPerQueue; ++i) new Call(this, cq.get());
    threads_.emplace_back(&AsyncLookupServer::Serve, cq.get());
  }
}

void AsyncLookupServer::Serve(grpc::ServerCompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) static_cast<Call*>(tag)->Proceed(ok);
}

void AsyncLookupServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  stopping_.store(true, std::memory_order_release);
  for (auto& cq : cqs_) cq->Shutdown();
  for (std::thread& t : threads_) t.join();
  // Queues whose thread never started (Start not called): drain here.
  if (threads_.empty()) {
    for (auto& cq : cqs_) Serve(cq.get());
  }
}

}  // namespace kiln
