// The client side of a Lookup hit without copying the artifact's binary.
//
// kilnd answers Lookup with the serialized LookupResponse straight from its
// hot cache (server/kiln_service.h). The generated stub would parse it into a
// v1::Artifact, copying the ~100 KB shared object into a std::string that is
// then hashed, written to a memfd and dropped. RawLookupStub instead receives
// the response as gRPC slices (the buffers the transport filled; no copy),
// and ParseLookupResponse parses every field of the artifact except the CPU
// binary, which it leaves where it is and describes as a list of pieces.
// CpuExecutable::LoadFromPieces hashes those pieces and writes them to the
// memfd: the binary is verified and loaded without a user-space copy.
//
//   RawLookupStub stub(channel);
//   grpc::ClientContext ctx;
//   std::vector<grpc::Slice> slices;
//   grpc::Status s = stub.Lookup(&ctx, key, &slices);
//   absl::StatusOr<ReceivedArtifact> got =
//   ParseLookupResponse(std::move(slices)); auto exe =
//   CpuExecutable::LoadFromPieces(got->TakeArtifact(), got->binary());
//
// Nothing here checks the binary: ReceivedArtifact holds unverified bytes.
// The SHA-256 check stays where the code is loaded (LoadedLibrary::Load), so
// no path can load bytes that were not hashed first.
//
// Thread-safety: a RawLookupStub may be used from several threads at once; a
// ReceivedArtifact is a value (not shared).
#ifndef KILN_CLIENT_RAW_LOOKUP_H_
#define KILN_CLIENT_RAW_LOOKUP_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/rpc_method.h"
#include "kiln/v1/artifact.pb.h"
#include "support/sha256.h"

namespace kiln {

// kiln.v1.Kiln/Lookup with raw bytes in and out.
//
// A call blocks its thread until the response is in, like the generated
// stub's, but on a completion queue kept from an earlier call rather than a
// new one per call (as grpc::internal::BlockingUnaryCall makes): creating
// and destroying a queue costs a poller and, with gRPC's poll engine, an
// eventfd per call.
class RawLookupStub {
 public:
  explicit RawLookupStub(std::shared_ptr<grpc::ChannelInterface> channel);
  ~RawLookupStub();

  RawLookupStub(const RawLookupStub&) = delete;
  RawLookupStub& operator=(const RawLookupStub&) = delete;

  // Sends a LookupRequest for `guard_key`; on success `*response` holds the
  // response's bytes as the transport received them (references, no copy).
  grpc::Status Lookup(grpc::ClientContext* ctx, absl::string_view guard_key,
                      std::vector<grpc::Slice>* response);

 private:
  // Queues kept for reuse: at most this many (as many as calls that ran at
  // once, up to the bound); a call finds one or makes one.
  static constexpr size_t kMaxIdleQueues = 64;

  std::unique_ptr<grpc::CompletionQueue> TakeQueue();
  void ReturnQueue(std::unique_ptr<grpc::CompletionQueue> cq);

  std::shared_ptr<grpc::ChannelInterface> channel_;
  grpc::internal::RpcMethod method_;
  absl::Mutex mu_;
  // Each holds no pending event: a call returns its queue once its one
  // event has been taken.
  std::vector<std::unique_ptr<grpc::CompletionQueue>> idle_queues_
      ABSL_GUARDED_BY(mu_);
};

// A parsed LookupResponse whose CPU binary still lies in the received slices.
// Movable (the pieces stay valid: they point into heap memory it owns), not
// copyable.
class ReceivedArtifact {
 public:
  ReceivedArtifact(ReceivedArtifact&&) = default;
  ReceivedArtifact& operator=(ReceivedArtifact&&) = default;
  ReceivedArtifact(const ReceivedArtifact&) = delete;
  ReceivedArtifact& operator=(const ReceivedArtifact&) = delete;

  // Every field of the artifact except cpu.shared_object, which is empty
  // (cpu is set when the response had one). CUDA artifacts are parsed whole
  // (their cubin is copied as usual).
  const v1::Artifact& artifact() const { return artifact_; }
  // Moves the artifact out; binary() stays valid.
  v1::Artifact TakeArtifact() { return std::move(artifact_); }

  // The bytes of cpu.shared_object, in order; empty for a CUDA artifact.
  // Valid while this object lives. Not verified.
  absl::Span<const absl::string_view> binary() const { return binary_; }
  size_t binary_size() const;

  // LookupResponse.artifact_signature (empty if none), and the SHA-256 of
  // the artifact's bytes as received, which it signs
  // (support/artifact_signature.h). ArtifactDigest hashes them each call.
  const std::string& signature() const { return signature_; }
  Sha256Digest ArtifactDigest() const;

 private:
  friend absl::StatusOr<ReceivedArtifact> ParseLookupResponse(
      std::vector<grpc::Slice> slices);
  ReceivedArtifact() = default;

  std::vector<grpc::Slice> slices_;  // owns what binary_ points into
  std::deque<std::string> copied_;   // small pieces copied out (see .cc)
  v1::Artifact artifact_;
  std::vector<absl::string_view> binary_;
  std::string signature_;
  size_t artifact_offset_ = 0;  // where the artifact's bytes start in slices_
  size_t artifact_length_ = 0;
};

// Parses the bytes of a LookupResponse (as RawLookupStub::Lookup returns
// them). Errors: DATA_LOSS when they are not a LookupResponse with an
// artifact (truncated, malformed, or a binary oneof set twice).
absl::StatusOr<ReceivedArtifact> ParseLookupResponse(
    std::vector<grpc::Slice> slices);

}  // namespace kiln

#endif  // KILN_CLIENT_RAW_LOOKUP_H_
