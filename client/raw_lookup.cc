#include "client/raw_lookup.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/support/async_unary_call.h"
#include "kiln/v1/service.pb.h"

namespace kiln {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;

constexpr char kLookupMethod[] = "/kiln.v1.Kiln/Lookup";

// A ZeroCopyInputStream over received slices: Next() hands out the slices'
// own memory, so pointers taken from it stay valid while the slices live.
class SliceInputStream final
    : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit SliceInputStream(const std::vector<grpc::Slice>& slices)
      : slices_(slices) {}

  bool Next(const void** data, int* size) override {
    if (backed_up_ > 0) {
      const grpc::Slice& s = slices_[index_ - 1];
      *data = s.begin() + (s.size() - backed_up_);
      *size = backed_up_;
      byte_count_ += backed_up_;
      backed_up_ = 0;
      return true;
    }
    while (index_ < slices_.size()) {
      const grpc::Slice& s = slices_[index_++];
      if (s.size() == 0) continue;
      *data = s.begin();
      *size = static_cast<int>(s.size());
      byte_count_ += *size;
      return true;
    }
    return false;
  }
  void BackUp(int count) override {
    backed_up_ = count;
    byte_count_ -= count;
  }
  bool Skip(int count) override {
    const void* data = nullptr;
    int size = 0;
    while (count > 0) {
      if (!Next(&data, &size)) return false;
      if (size > count) {
        BackUp(size - count);
        return true;
      }
      count -= size;
    }
    return true;
  }
  int64_t ByteCount() const override { return byte_count_; }

 private:
  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  int backed_up_ = 0;
  int64_t byte_count_ = 0;
};

absl::Status Malformed(absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat("the Lookup response is not a LookupResponse: ", what));
}

bool IsLengthDelimited(uint32_t tag) {
  return WireFormatLite::GetTagWireType(tag) ==
         WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
}

// Reads `length` bytes as views into the stream's buffers (no copy).
bool ReadPieces(CodedInputStream& in, uint32_t length,
                std::vector<absl::string_view>* pieces) {
  while (length > 0) {
    const void* data = nullptr;
    int size = 0;
    if (!in.GetDirectBufferPointer(&data, &size) || size <= 0) return false;
    const uint32_t take =
        std::min<uint32_t>(length, static_cast<uint32_t>(size));
    pieces->emplace_back(static_cast<const char*>(data), take);
    if (!in.Skip(static_cast<int>(take))) return false;
    length -= take;
  }
  return true;
}

// A CpuBinary up to the current limit: shared_object as pieces (the last
// occurrence wins, as in protobuf), any other field copied to `rest`.
absl::Status ParseCpuBinary(CodedInputStream& in,
                            std::vector<absl::string_view>* shared_object,
                            std::string* rest) {
  StringOutputStream rest_stream(rest);
  CodedOutputStream out(&rest_stream);
  while (const uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) ==
            v1::CpuBinary::kSharedObjectFieldNumber &&
        IsLengthDelimited(tag)) {
      uint32_t length = 0;
      if (!in.ReadVarint32(&length)) return Malformed("a truncated length");
      shared_object->clear();
      if (!ReadPieces(in, length, shared_object)) {
        return Malformed("a truncated shared object");
      }
    } else if (!WireFormatLite::SkipField(&in, tag, &out)) {
      return Malformed("a truncated field in the CPU binary");
    }
  }
  if (!in.ConsumedEntireMessage()) return Malformed("a bad tag");
  return absl::OkStatus();
}

}  // namespace

RawLookupStub::RawLookupStub(std::shared_ptr<grpc::ChannelInterface> channel)
    : channel_(std::move(channel)),
      method_(kLookupMethod, grpc::internal::RpcMethod::NORMAL_RPC, channel_) {}

namespace {

// Shuts `cq` down and takes what is left on it (the shutdown event only:
// queues are idle when this runs), as gRPC requires before destroying it.
void DrainAndDestroy(std::unique_ptr<grpc::CompletionQueue> cq) {
  cq->Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) {
  }
}

}  // namespace

RawLookupStub::~RawLookupStub() {
  absl::MutexLock lock(&mu_);
  for (std::unique_ptr<grpc::CompletionQueue>& cq : idle_queues_) {
    DrainAndDestroy(std::move(cq));
  }
}

std::unique_ptr<grpc::CompletionQueue> RawLookupStub::TakeQueue() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_queues_.empty()) {
      std::unique_ptr<grpc::CompletionQueue> cq =
          std::move(idle_queues_.back());
      idle_queues_.pop_back();
      return cq;
    }
  }
  return std::make_unique<grpc::CompletionQueue>();
}

void RawLookupStub::ReturnQueue(std::unique_ptr<grpc::CompletionQueue> cq) {
  {
    absl::MutexLock lock(&mu_);
    if (idle_queues_.size() < kMaxIdleQueues) {
      idle_queues_.push_back(std::move(cq));
      return;
    }
  }
  DrainAndDestroy(std::move(cq));
}

grpc::Status RawLookupStub::Lookup(grpc::ClientContext* ctx,
                                   absl::string_view guard_key,
                                   std::vector<grpc::Slice>* response) {
  v1::LookupRequest req;
  req.set_guard_key(std::string(guard_key));
  grpc::Slice request_slice(req.SerializeAsString());
  const grpc::ByteBuffer request(&request_slice, 1);
  grpc::ByteBuffer reply;
  grpc::Status s;
  std::unique_ptr<grpc::CompletionQueue> cq = TakeQueue();
  {
    // The reader lives in the call's arena (its delete only checks).
    std::unique_ptr<grpc::ClientAsyncResponseReader<grpc::ByteBuffer>> call(
        grpc::internal::ClientAsyncResponseReaderHelper::Create<
            grpc::ByteBuffer>(channel_.get(), cq.get(), method_, ctx, request));
    call->StartCall();
    call->Finish(&reply, &s, /*tag=*/this);
  }
  // The call's one event (Finish's): the queue then holds nothing.
  void* tag = nullptr;
  bool ok = false;
  if (!cq->Next(&tag, &ok) || tag != this) {
    // Not expected; this queue is not reused.
    DrainAndDestroy(std::move(cq));
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "the Lookup call's completion queue failed");
  }
  ReturnQueue(std::move(cq));
  if (!s.ok()) return s;
  response->clear();
  if (!reply.Dump(response).ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL,
                        "cannot read the Lookup response's bytes");
  }
  return s;
}

size_t ReceivedArtifact::binary_size() const {
  size_t n = 0;
  for (absl::string_view piece : binary_) n += piece.size();
  return n;
}

Sha256Digest ReceivedArtifact::ArtifactDigest() const {
  Sha256Hasher hasher;
  size_t skip = artifact_offset_;
  size_t left = artifact_length_;
  for (const grpc::Slice& slice : slices_) {
    if (left == 0) break;
    size_t size = slice.size();
    const char* data = reinterpret_cast<const char*>(slice.begin());
    if (skip >= size) {
      skip -= size;
      continue;
    }
    data += skip;
    size -= skip;
    skip = 0;
    const size_t take = std::min(size, left);
    hasher.Update(absl::string_view(data, take));
    left -= take;
  }
  return hasher.Finish();
}

absl::StatusOr<ReceivedArtifact> ParseLookupResponse(
    std::vector<grpc::Slice> slices) {
  ReceivedArtifact got;
  // Moved in first: the views below point into these slices' memory (the
  // vector's heap array holds inlined slices' bytes), which moves of `got`
  // keep in place.
  got.slices_ = std::move(slices);
  SliceInputStream stream(got.slices_);
  CodedInputStream in(&stream);
  std::string rest;      // the artifact's fields other than cpu
  std::string cpu_rest;  // cpu's fields other than shared_object
  bool saw_artifact = false;
  bool saw_cpu = false;
  bool saw_cuda = false;
  while (const uint32_t tag = in.ReadTag()) {
    if (WireFormatLite::GetTagFieldNumber(tag) ==
            v1::LookupResponse::kArtifactSignatureFieldNumber &&
        IsLengthDelimited(tag)) {
      if (!WireFormatLite::ReadBytes(&in, &got.signature_)) {
        return Malformed("a truncated signature");
      }
      continue;
    }
    if (WireFormatLite::GetTagFieldNumber(tag) !=
            v1::LookupResponse::kArtifactFieldNumber ||
        !IsLengthDelimited(tag)) {
      if (!WireFormatLite::SkipField(&in, tag)) {
        return Malformed("a truncated field");
      }
      continue;
    }
    // kilnd sends one artifact; merging two is not worth supporting here.
    if (saw_artifact) return Malformed("two artifacts");
    saw_artifact = true;
    uint32_t artifact_length = 0;
    if (!in.ReadVarint32(&artifact_length)) {
      return Malformed("a truncated length");
    }
    got.artifact_offset_ = static_cast<size_t>(in.CurrentPosition());
    got.artifact_length_ = artifact_length;
    const CodedInputStream::Limit artifact_limit =
        in.PushLimit(static_cast<int>(artifact_length));
    {
      StringOutputStream rest_stream(&rest);
      CodedOutputStream out(&rest_stream);
      while (const uint32_t field_tag = in.ReadTag()) {
        const int field = WireFormatLite::GetTagFieldNumber(field_tag);
        if (field == v1::Artifact::kCpuFieldNumber &&
            IsLengthDelimited(field_tag)) {
          if (saw_cuda) return Malformed("both a CPU and a CUDA binary");
          saw_cpu = true;
          uint32_t length = 0;
          if (!in.ReadVarint32(&length)) return Malformed("a truncated length");
          const CodedInputStream::Limit limit =
              in.PushLimit(static_cast<int>(length));
          absl::Status s = ParseCpuBinary(in, &got.binary_, &cpu_rest);
          if (!s.ok()) return s;
          in.PopLimit(limit);
          continue;
        }
        if (field == v1::Artifact::kCudaFieldNumber) {
          if (saw_cpu) return Malformed("both a CPU and a CUDA binary");
          saw_cuda = true;
        }
        if (!WireFormatLite::SkipField(&in, field_tag, &out)) {
          return Malformed("a truncated field in the artifact");
        }
      }
      if (!in.ConsumedEntireMessage()) return Malformed("a bad tag");
    }
    in.PopLimit(artifact_limit);
  }
  if (!in.ConsumedEntireMessage()) return Malformed("a bad tag");
  if (!saw_artifact) return Malformed("no artifact");
  if (!got.artifact_.ParseFromString(rest)) {
    return Malformed("the artifact's fields do not parse");
  }
  if (saw_cpu && !got.artifact_.mutable_cpu()->ParseFromString(cpu_rest)) {
    return Malformed("the CPU binary's fields do not parse");
  }
  return got;
}

}  // namespace kiln
