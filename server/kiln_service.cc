#include "server/kiln_service.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "compiler/compile.h"
#include "compiler/compiler_identity.h"
#include "compiler/op_lowering.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "graph/guard_key.h"
#include "graph/import.h"
#include "graph/op_signature.h"
#include "grpc/grpc_security_constants.h"
#include "spdlog/spdlog.h"

namespace kiln {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

std::string KeyBytes(const Sha256Digest& key) {
  return std::string(reinterpret_cast<const char*>(key.data()), key.size());
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

// The bytes of a LookupResponse up to its artifact's bytes: the tag of field
// `artifact` and the length (protobuf's wire format for a message field).
grpc::Slice LookupResponseHeader(size_t artifact_bytes) {
  using google::protobuf::internal::WireFormatLite;
  using google::protobuf::io::CodedOutputStream;
  uint8_t header[16];
  uint8_t* end = CodedOutputStream::WriteTagToArray(
      WireFormatLite::MakeTag(v1::LookupResponse::kArtifactFieldNumber,
                              WireFormatLite::WIRETYPE_LENGTH_DELIMITED),
      header);
  end = CodedOutputStream::WriteVarint64ToArray(artifact_bytes, end);
  return grpc::Slice(header, static_cast<size_t>(end - header));
}

// LookupResponse's field artifact_signature holding `signature` (empty for
// none): what follows the artifact's bytes in a Lookup response.
grpc::Slice SignatureField(const std::string& signature) {
  if (signature.empty()) return grpc::Slice();
  using google::protobuf::internal::WireFormatLite;
  using google::protobuf::io::CodedOutputStream;
  std::string field(16 + signature.size(), '\0');
  uint8_t* begin = reinterpret_cast<uint8_t*>(field.data());
  uint8_t* end = CodedOutputStream::WriteTagToArray(
      WireFormatLite::MakeTag(v1::LookupResponse::kArtifactSignatureFieldNumber,
                              WireFormatLite::WIRETYPE_LENGTH_DELIMITED),
      begin);
  end = CodedOutputStream::WriteVarint64ToArray(signature.size(), end);
  std::memcpy(end, signature.data(), signature.size());
  end += signature.size();
  return grpc::Slice(begin, static_cast<size_t>(end - begin));
}

// The bytes of a ByteBuffer as one string (requests here are small).
std::string BufferBytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!buffer.Dump(&slices).ok()) return bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

// A gRPC peer string ("ipv4:127.0.0.1:5555", "ipv6:[::1]:5555",
// "unix:/path") on this host.
bool IsLocalPeer(absl::string_view peer) {
  return absl::StartsWith(peer, "unix:") ||
         absl::StartsWith(peer, "ipv4:127.") ||
         absl::StartsWith(peer, "ipv6:[::1]") ||
         absl::StartsWith(peer, "ipv6:%5B::1%5D");
}

}  // namespace

KilnService::KilnService(ArtifactStore* store,
                         const KilnServiceOptions& options)
    : store_(store),
      options_(options),
      identity_(options.compiler_identity.empty() ? CompilerIdentity()
                                                  : options.compiler_identity),
      pool_(std::make_unique<CompilePool>(options.compile_threads,
                                          options.max_queued_compiles,
                                          options.per_token_limits)),
      shared_pool_(options.shared ? std::make_unique<CompilePool>(
                                        std::max(1, options.shared_threads),
                                        options.max_queued_compiles * 4)
                                  : nullptr),
      hot_(options.hot_cache_bytes) {}

KilnService::~KilnService() { Drain(); }

absl::StatusOr<Identity> KilnService::Authorize(
    const grpc::ServerContextBase& ctx, Role role, const char* method) const {
  if (auth_ == nullptr && cert_roles_ == nullptr) {
    // Without tokens, a verified client certificate (mTLS) still names the
    // caller for the per-caller compile limits.
    std::shared_ptr<const grpc::AuthContext> peer = ctx.auth_context();
    if (peer != nullptr && peer->IsPeerAuthenticated()) {
      const std::vector<grpc::string_ref> names = peer->GetPeerIdentity();
      if (!names.empty()) {
        return Identity{std::string(names[0].data(), names[0].size()),
                        "client certificate"};
      }
    }
    return Identity{};
  }
  const auto& metadata = ctx.client_metadata();
  auto it = metadata.find("authorization");
  const absl::string_view authorization =
      it == metadata.end()
          ? absl::string_view()
          : absl::string_view(it->second.data(), it->second.size());
  absl::StatusOr<Identity> identity;
  if (cert_roles_ != nullptr && (auth_ == nullptr || authorization.empty())) {
    // By the verified client certificate's common name.
    std::string common_name;
    std::shared_ptr<const grpc::AuthContext> peer = ctx.auth_context();
    if (peer != nullptr && peer->IsPeerAuthenticated()) {
      for (const grpc::string_ref& cn :
           peer->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
        common_name.assign(cn.data(), cn.size());
        break;
      }
    }
    identity = cert_roles_->Check(common_name, role, method);
  } else {
    identity = auth_->Check(authorization, role, method);
  }
  if (!identity.ok()) {
    spdlog::warn("rpc={} outcome=denied peer={} status=\"{}\"", method,
                 ctx.peer(), identity.status().ToString());
  }
  return identity;
}

void KilnService::Drain() {
  // Flights waiting on another replica stop waiting and compile here.
  draining_ = true;
  shared_pool_.reset();
  pool_.reset();
}

Sha256Digest KilnService::StoreKeyOf(const Sha256Digest& request_key) const {
  return StoreKey(request_key, identity_);
}

std::shared_ptr<const HotArtifact> KilnService::FindHot(const Sha256Digest& key,
                                                        bool* from_memory) {
  *from_memory = false;
  if (auto hot = hot_.Find(key)) {
    // Served from memory only while the store holds that very entry.
    if (store_->RecordHit(key, hot->created)) {
      *from_memory = true;
      return hot;
    }
    hot_.Erase(key);
  }
  auto got = store_->Get(key);
  if (!got.ok() || !got->has_value()) return nullptr;
  const std::string& payload = (*got)->payload;
  // Parsed once here, so that hits never need to: the store verified the
  // bytes' hash, so an unparsable payload was written by an incompatible
  // build. Drop it and compile afresh.
  if (v1::Artifact artifact; !artifact.ParseFromString(payload)) {
    spdlog::warn("event=unparsable_cache_entry key={}",
                 DigestToHex(key).substr(0, 16));
    (void)store_->Delete(key);
    return nullptr;
  }
  auto hot = std::make_shared<HotArtifact>();
  hot->artifact_bytes = grpc::Slice(payload.data(), payload.size());
  hot->created = (*got)->created;
  // Signed once as it enters memory: hits send the signature kept here.
  hot->signature = SignArtifact(payload);
  hot->signature_field = SignatureField(hot->signature);
  hot_.Insert(key, hot);
  return hot;
}

std::shared_ptr<const v1::Artifact> KilnService::FromCache(
    const Sha256Digest& key) {
  bool from_memory = false;
  std::shared_ptr<const HotArtifact> hot = FindHot(key, &from_memory);
  if (!hot) return nullptr;
  auto artifact = std::make_shared<v1::Artifact>();
  if (!artifact->ParseFromArray(hot->artifact_bytes.begin(),
                                static_cast<int>(hot->artifact_bytes.size())))
    return nullptr;  // FindHot parsed these very bytes
  return artifact;
}

namespace {

// Errors worth caching fleet-wide: what the same request would get again.
bool IsDeterministicError(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return true;
    default:
      return false;
  }
}

// The bytes of an artifact's binary (CPU shared object or CUDA cubin).
absl::string_view BinaryBytes(const v1::Artifact& artifact) {
  if (artifact.has_cpu()) return artifact.cpu().shared_object();
  if (artifact.has_cuda()) return artifact.cuda().cubin();
  return {};
}

}  // namespace

absl::StatusOr<std::shared_ptr<const v1::Artifact>> KilnService::FetchShared(
    const ImportedRequest& request, const Sha256Digest& key) {
  absl::StatusOr<std::optional<std::string>> got =
      options_.shared->GetArtifact(key);
  if (!got.ok()) return got.status();
  if (!got->has_value()) return nullptr;
  const std::string& payload = **got;
  auto artifact = std::make_shared<v1::Artifact>();
  std::string why;
  if (!artifact->ParseFromString(payload)) {
    why = "unparsable artifact";
  } else if (artifact->guard_key() != KeyBytes(request.key)) {
    why = "artifact of another request key";
  } else if (BinaryBytes(*artifact).empty() ||
             KeyBytes(Sha256(BinaryBytes(*artifact))) !=
                 artifact->binary_sha256()) {
    why = "binary does not match its SHA-256";
  }
  if (!why.empty()) {
    shared_rejected_.fetch_add(1);
    spdlog::warn("event=shared_cache_rejected key={} reason=\"{}\"",
                 DigestToHex(key).substr(0, 16), why);
    (void)options_.shared->DeleteArtifact(key);
    return nullptr;
  }
  PutMetadata meta;
  meta.compile_seconds = artifact->compile_seconds();
  meta.label = request.key;
  // The very bytes the fleet holds, so every replica's copy is identical.
  if (absl::Status s = store_->Put(key, payload, meta); !s.ok()) {
    spdlog::error("event=cache_put_failed key={} status=\"{}\"",
                  DigestToHex(key).substr(0, 16), s.ToString());
  }
  return std::shared_ptr<const v1::Artifact>(std::move(artifact));
}

void KilnService::SubmitCompile(std::shared_ptr<const ImportedRequest> request,
                                const Sha256Digest& key, bool leased,
                                const std::string& fair_use_key) {
  absl::Status queued =
      pool_ ? pool_->SubmitFor(fair_use_key,
                               [this, request, key, leased] {
                                 RunCompile(*request, key, leased);
                               })
            : absl::UnavailableError("kilnd is stopping");
  if (queued.ok()) return;
  if (leased) options_.shared->ReleaseLease(key);
  // Those who joined this flight get the same refusal and may retry.
  inflight_.Finish(key, queued);
}

void KilnService::ResolveShared(std::shared_ptr<const ImportedRequest> request,
                                const Sha256Digest& key,
                                const std::string& fair_use_key) {
  SharedTier& shared = *options_.shared;
  const absl::Time deadline = absl::Now() + options_.max_deadline;
  bool waited = false;
  while (!draining_) {
    if (auto cached = FromCache(key)) {
      inflight_.Finish(key, CompileResult(std::move(cached)));
      return;
    }
    auto fetched = FetchShared(*request, key);
    if (!fetched.ok()) break;
    if (*fetched) {
      inflight_.Finish(key, CompileResult(*std::move(fetched)));
      return;
    }
    absl::StatusOr<std::optional<absl::Status>> error = shared.GetError(key);
    if (!error.ok()) break;
    if (error->has_value()) {
      inflight_.Finish(key, **error);
      return;
    }
    absl::StatusOr<bool> leased = shared.TryLease(key);
    if (!leased.ok()) break;
    if (*leased) {
      // The holder may have published and released between our look and
      // our lease.
      fetched = FetchShared(*request, key);
      if (fetched.ok() && *fetched) {
        shared.ReleaseLease(key);
        inflight_.Finish(key, CompileResult(*std::move(fetched)));
        return;
      }
      if (waited) {
        takeovers_.fetch_add(1);
        spdlog::info("event=shared_lease_takeover key={}",
                     DigestToHex(key).substr(0, 16));
      }
      SubmitCompile(std::move(request), key, /*leased=*/true, fair_use_key);
      return;
    }
    if (!waited) {
      waited = true;
      lease_waits_.fetch_add(1);
    }
    if (absl::Now() >= deadline) break;
    shared.WaitForPublish(key, deadline);
  }
  // The shared tier is down, failed, or took too long: compile here.
  SubmitCompile(std::move(request), key, /*leased=*/false, fair_use_key);
}

void KilnService::RunCompile(const ImportedRequest& request,
                             const Sha256Digest& key, bool leased) {
  SharedTier* shared = options_.shared;
  // Another leader may have finished between our cache miss and Join.
  if (auto cached = FromCache(key)) {
    if (leased) shared->ReleaseLease(key);
    inflight_.Finish(key, CompileResult(std::move(cached)));
    return;
  }
  compiles_.fetch_add(1);
  if (options_.test_compile_delay > absl::ZeroDuration())
    absl::SleepFor(options_.test_compile_delay);
  auto artifact = kiln::Compile(request);
  if (metrics_ && artifact.ok())
    metrics_->ObserveCompileSeconds(artifact->compile_seconds());
  if (!artifact.ok()) {
    compile_errors_.fetch_add(1);
    if (shared && IsDeterministicError(artifact.status()))
      (void)shared->PutError(key, artifact.status());
    if (leased) shared->ReleaseLease(key);
    inflight_.Finish(key, artifact.status());
    return;
  }
  std::string payload;
  artifact->SerializeToString(&payload);
  PutMetadata meta;
  meta.compile_seconds = artifact->compile_seconds();
  meta.label = request.key;
  if (absl::Status s = store_->Put(key, payload, meta); !s.ok()) {
    // Serve the artifact anyway; the next request compiles again.
    spdlog::error("event=cache_put_failed key={} status=\"{}\"",
                  DigestToHex(key).substr(0, 16), s.ToString());
  }
  // Published even without the lease (compiled while the tier was down):
  // the shared tier fills again once it is back.
  if (shared) {
    if (absl::Status s =
            shared->PutArtifact(key, payload, artifact->compile_seconds());
        !s.ok() && shared->up()) {
      spdlog::warn("event=shared_cache_put_failed key={} status=\"{}\"",
                   DigestToHex(key).substr(0, 16), s.ToString());
    }
    if (leased) shared->ReleaseLease(key);
  }
  inflight_.Finish(key, CompileResult(std::make_shared<const v1::Artifact>(
                            *std::move(artifact))));
}

grpc::Status KilnService::Compile(grpc::ServerContext* ctx,
                                  const v1::CompileRequest* req,
                                  v1::CompileResponse* resp) {
  const ActivityTracker::Busy busy = activity_.Begin();
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<Identity> identity = Authorize(*ctx, Role::kCompile, "Compile");
  if (!identity.ok()) return Done("Compile", ToGrpc(identity.status()));
  // Validated, imported and keyed once: the compile pool takes this.
  absl::StatusOr<ImportedRequest> imported = ImportRequest(*req);
  if (!imported.ok()) {
    spdlog::info("rpc=Compile outcome=rejected status=\"{}\"",
                 imported.status().ToString());
    return Done("Compile", ToGrpc(imported.status()));
  }
  const GuardKey request_key = imported->key;
  const Sha256Digest key = StoreKeyOf(request_key);
  const std::string key_hex = DigestToHex(request_key).substr(0, 16);
  resp->set_guard_key(KeyBytes(request_key));

  v1::CompileResponse::Outcome outcome = v1::CompileResponse::HIT;
  bool from_memory = false;
  if (std::shared_ptr<const HotArtifact> hot = FindHot(key, &from_memory)) {
    hits_.fetch_add(1);
    if (from_memory) hot_hits_.fetch_add(1);
    // Parsed straight into the response: one pass over the bytes.
    if (!resp->mutable_artifact()->ParseFromArray(
            hot->artifact_bytes.begin(),
            static_cast<int>(hot->artifact_bytes.size()))) {
      return Done("Compile", grpc::Status(grpc::StatusCode::INTERNAL,
                                          "cannot parse a cached artifact"));
    }
    resp->set_artifact_signature(hot->signature);
  } else {
    misses_.fetch_add(1);
    InflightCompiles::Ticket ticket = inflight_.Join(key);
    outcome = ticket.leader ? v1::CompileResponse::COMPILED
                            : v1::CompileResponse::JOINED;
    if (ticket.leader) {
      // The compile runs on the pool with its own copy of the imported
      // request, so a caller that gives up does not cancel it for the others.
      auto request =
          std::make_shared<const ImportedRequest>(*std::move(imported));
      const std::string fair_use_key = identity->FairUseKey();
      if (shared_pool_ && options_.shared->up()) {
        if (!shared_pool_->Submit([this, request, key, fair_use_key] {
              ResolveShared(request, key, fair_use_key);
            }))
          SubmitCompile(request, key, /*leased=*/false, fair_use_key);
      } else {
        SubmitCompile(request, key, /*leased=*/false, fair_use_key);
      }
    } else {
      joins_.fetch_add(1);
    }
    auto deadline = std::min(ctx->deadline(),
                             std::chrono::system_clock::now() +
                                 absl::ToChronoSeconds(options_.max_deadline));
    if (ticket.result.wait_until(deadline) != std::future_status::ready) {
      spdlog::info("rpc=Compile key={} outcome=deadline server_ms={:.2f}",
                   key_hex, SecondsSince(t0) * 1e3);
      return Done(
          "Compile",
          grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                       "the compile is still running; it will land in the "
                       "cache, retry to pick it up"));
    }
    const CompileResult& result = ticket.result.get();
    if (!result.ok()) {
      spdlog::info("rpc=Compile key={} outcome=error status=\"{}\"", key_hex,
                   result.status().ToString());
      return Done("Compile", ToGrpc(result.status()));
    }
    *resp->mutable_artifact() = **result;
    // Over the serialization the cache holds (and a client re-makes).
    if (options_.signer != nullptr)
      resp->set_artifact_signature(
          SignArtifact((*result)->SerializeAsString()));
  }
  const v1::Artifact& artifact = resp->artifact();
  resp->set_outcome(outcome);
  resp->set_compile_seconds(artifact.compile_seconds());
  resp->set_server_seconds(SecondsSince(t0));
  spdlog::info(
      "rpc=Compile key={} outcome={} server_ms={:.2f} compile_ms={:.2f}{}",
      key_hex,
      absl::AsciiStrToLower(v1::CompileResponse::Outcome_Name(outcome)),
      resp->server_seconds() * 1e3, artifact.compile_seconds() * 1e3,
      identity->name.empty() ? std::string()
                             : absl::StrCat(" caller=\"", identity->FairUseKey(),
                                            "\""));
  return Done("Compile", grpc::Status::OK);
}

grpc::ServerUnaryReactor* KilnService::Lookup(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  const ActivityTracker::Busy busy = activity_.Begin();
  // A hit never blocks (memory, or one RocksDB read), so it is answered on
  // the callback thread itself.
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  if (absl::StatusOr<Identity> identity =
          Authorize(*ctx, Role::kCompile, "Lookup");
      !identity.ok()) {
    reactor->Finish(Done("Lookup", ToGrpc(identity.status())));
    return reactor;
  }
  absl::StatusOr<std::shared_ptr<const HotArtifact>> hot =
      LookupKey(BufferBytes(*request));
  if (hot.ok()) {
    // The ByteBuffer takes references to the slices: the artifact bytes are
    // shared with HotArtifacts, not copied.
    const grpc::Slice slices[] = {
        LookupResponseHeader((*hot)->artifact_bytes.size()),
        (*hot)->artifact_bytes, (*hot)->signature_field};
    *response =
        grpc::ByteBuffer(slices, (*hot)->signature_field.size() > 0 ? 3 : 2);
  }
  reactor->Finish(Done("Lookup", ToGrpc(hot.status())));
  return reactor;
}

HitReply KilnService::LookupOnHitSocket(absl::string_view request) {
  const ActivityTracker::Busy busy = activity_.Begin();
  HitReply reply;
  if (auth_ != nullptr) {
    // The token travels in the request itself (the hit socket has no
    // metadata); kilnd serves this socket on loopback or a Unix socket only
    // when it has tokens or TLS (kilnd_main.cc).
    v1::LookupRequest parsed;
    absl::StatusOr<Identity> identity =
        parsed.ParseFromArray(request.data(), static_cast<int>(request.size()))
            ? auth_->Check(parsed.authorization(), Role::kCompile,
                           "HitSocketLookup")
            : absl::InvalidArgumentError("the request is not a LookupRequest");
    if (!identity.ok()) {
      spdlog::warn("rpc=HitSocketLookup outcome=denied status=\"{}\"",
                   identity.status().ToString());
      Done("HitSocketLookup", ToGrpc(identity.status()));
      reply.status = identity.status();
      return reply;
    }
  }
  absl::StatusOr<std::shared_ptr<const HotArtifact>> hot = LookupKey(request);
  Done("HitSocketLookup", ToGrpc(hot.status()));
  if (!hot.ok()) {
    reply.status = hot.status();
    return reply;
  }
  // The response header's bytes live in a slice kept with the artifact's.
  struct Held {
    grpc::Slice header;
    std::shared_ptr<const HotArtifact> hot;
  };
  auto held = std::make_shared<Held>(
      Held{LookupResponseHeader((*hot)->artifact_bytes.size()), *hot});
  auto view = [](const grpc::Slice& slice) {
    return absl::string_view(reinterpret_cast<const char*>(slice.begin()),
                             slice.size());
  };
  reply.pieces = {view(held->header), view(held->hot->artifact_bytes)};
  if (held->hot->signature_field.size() > 0)
    reply.pieces.push_back(view(held->hot->signature_field));
  reply.keep_alive = std::move(held);
  return reply;
}

absl::StatusOr<std::shared_ptr<const HotArtifact>> KilnService::LookupKey(
    absl::string_view request_bytes) {
  v1::LookupRequest req;
  if (!req.ParseFromArray(request_bytes.data(),
                          static_cast<int>(request_bytes.size()))) {
    return absl::InvalidArgumentError("the request is not a LookupRequest");
  }
  Sha256Digest request_key{};
  if (req.guard_key().size() != request_key.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "guard_key must be 32 bytes, got ", req.guard_key().size()));
  }
  std::memcpy(request_key.data(), req.guard_key().data(), request_key.size());
  const Sha256Digest key = StoreKeyOf(request_key);
  bool from_memory = false;
  std::shared_ptr<const HotArtifact> hot = FindHot(key, &from_memory);
  if (!hot) {
    misses_.fetch_add(1);
    return absl::NotFoundError("no artifact under this key; send Compile");
  }
  hits_.fetch_add(1);
  if (from_memory) hot_hits_.fetch_add(1);
  return hot;
}

grpc::Status KilnService::GetServerInfo(grpc::ServerContext* ctx,
                                        const v1::GetServerInfoRequest*,
                                        v1::ServerInfo* resp) {
  const ActivityTracker::Busy busy = activity_.Begin();
  if (absl::StatusOr<Identity> identity =
          Authorize(*ctx, Role::kCompile, "GetServerInfo");
      !identity.ok())
    return Done("GetServerInfo", ToGrpc(identity.status()));
  resp->set_version(identity_);
  if ((hit_socket_.tcp_port() != 0 || !hit_socket_.unix_path().empty()) &&
      (!hit_socket_local_only_ || IsLocalPeer(ctx->peer())))
    *resp->mutable_hit_socket() = hit_socket_;
  if (options_.signer != nullptr)
    resp->set_signing_public_key(options_.signer->public_key());
  for (const std::string& op : OpSignatures::Get().Names()) {
    if (OpLowerings::Get().Find(op) != nullptr) resp->add_supported_ops(op);
  }
  return Done("GetServerInfo", grpc::Status::OK);
}

grpc::Status KilnService::GetStats(grpc::ServerContext* ctx,
                                   const v1::GetStatsRequest*,
                                   v1::Stats* resp) {
  const ActivityTracker::Busy busy = activity_.Begin();
  if (absl::StatusOr<Identity> identity =
          Authorize(*ctx, Role::kReadStats, "GetStats");
      !identity.ok())
    return Done("GetStats", ToGrpc(identity.status()));
  *resp = CurrentStats();
  return Done("GetStats", grpc::Status::OK);
}

v1::Stats KilnService::CurrentStats() const {
  v1::Stats stats;
  v1::Stats* resp = &stats;
  const CacheStats s = store_->Stats();
  resp->set_entries(s.entries);
  resp->set_bytes(s.bytes);
  resp->set_capacity_bytes(s.capacity_bytes);
  resp->set_hits(hits_.load());
  resp->set_misses(misses_.load());
  resp->set_compiles(compiles_.load());
  resp->set_joins(joins_.load());
  resp->set_compile_errors(compile_errors_.load());
  resp->set_evictions(s.evictions);
  resp->set_corrupt(s.corrupt_dropped);
  resp->set_compile_seconds_saved(s.compile_seconds_saved);
  resp->set_queue_depth(pool_ ? pool_->queue_depth() : 0);
  resp->set_hot_hits(hot_hits_.load());
  resp->set_hot_entries(hot_.entries());
  resp->set_hot_bytes(hot_.bytes());
  resp->set_hot_capacity_bytes(hot_.capacity_bytes());
  if (options_.shared) {
    const SharedTierStats t = options_.shared->Stats();
    resp->set_shared_cache_configured(true);
    resp->set_shared_cache_up(t.up);
    // An artifact the tier verified but the service rejected is a miss.
    resp->set_shared_hits(t.hits - std::min(t.hits, shared_rejected_.load()));
    resp->set_shared_misses(t.misses + shared_rejected_.load());
    resp->set_shared_lease_waits(lease_waits_.load());
    resp->set_shared_takeovers(takeovers_.load());
    resp->set_shared_bytes_read(t.bytes_read);
    resp->set_shared_bytes_written(t.bytes_written);
    resp->set_shared_corrupt(t.corrupt);
    resp->set_shared_error_hits(t.error_hits);
    resp->set_shared_failures(t.failures);
  }
  resp->set_store_recoveries(s.recoveries);
  resp->set_store_recovery_dropped(s.recovery_dropped);
  resp->set_store_last_recovery(s.last_recovery);
  resp->set_reload_failures(reload_failures_.load());
  return stats;
}

std::string KilnService::SignArtifact(absl::string_view artifact_bytes) const {
  if (options_.signer == nullptr) return "";
  return options_.signer->Sign(Sha256(artifact_bytes));
}

grpc::Status KilnService::Done(const char* method, grpc::Status status) {
  if (metrics_) metrics_->RecordRequest(method, status.error_code());
  return status;
}

grpc::Status KilnService::ListEntries(grpc::ServerContext* ctx,
                                      const v1::ListEntriesRequest* req,
                                      v1::ListEntriesResponse* resp) {
  const ActivityTracker::Busy busy = activity_.Begin();
  if (absl::StatusOr<Identity> identity =
          Authorize(*ctx, Role::kAdmin, "ListEntries");
      !identity.ok())
    return Done("ListEntries", ToGrpc(identity.status()));
  for (const EntryInfo& e : store_->List()) {
    if (req->limit() > 0 && resp->entries_size() >= req->limit()) break;
    auto* out = resp->add_entries();
    // This compiler's entries are listed by request key (what Compile
    // returns and Lookup takes); entries another build compiled (same data
    // dir, another identity) by their store key, marked as such.
    const bool ours = e.label && StoreKeyOf(*e.label) == e.key;
    out->set_guard_key(KeyBytes(ours ? *e.label : e.key));
    out->set_other_compiler(!ours);
    out->set_bytes(e.bytes);
    out->set_compile_seconds(e.compile_seconds);
    out->set_last_access_unix_ms(absl::ToUnixMillis(e.last_access));
  }
  return Done("ListEntries", grpc::Status::OK);
}

grpc::Status KilnService::Evict(grpc::ServerContext* ctx,
                                const v1::EvictRequest* req,
                                v1::EvictResponse* resp) {
  const ActivityTracker::Busy busy = activity_.Begin();
  if (absl::StatusOr<Identity> identity =
          Authorize(*ctx, Role::kAdmin, "Evict");
      !identity.ok())
    return Done("Evict", ToGrpc(identity.status()));
  if (req->all()) {
    const uint64_t before = store_->Stats().entries;
    absl::Status s = store_->EvictAll();
    // Entries the store no longer holds are never served from memory (see
    // FindHot); clearing frees their memory now.
    hot_.Clear();
    if (!s.ok()) return Done("Evict", ToGrpc(s));
    resp->set_evicted(before);
    return Done("Evict", grpc::Status::OK);
  }
  Sha256Digest key{};
  if (req->guard_key().size() != key.size()) {
    return Done("Evict",
                grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                             "guard_key must be 32 bytes (or set all)"));
  }
  std::memcpy(key.data(), req->guard_key().data(), key.size());
  // A request key names this compiler's entry; a key ListEntries marked
  // other_compiler is a store key already.
  if (const Sha256Digest ours = StoreKeyOf(key); store_->Contains(ours))
    key = ours;
  const bool present = store_->Contains(key);
  absl::Status s = store_->Delete(key);
  hot_.Erase(key);
  if (!s.ok()) return Done("Evict", ToGrpc(s));
  resp->set_evicted(present ? 1 : 0);
  return Done("Evict", grpc::Status::OK);
}

grpc::Status KilnService::ExplainKey(grpc::ServerContext* ctx,
                                     const v1::CompileRequest* req,
                                     v1::ExplainKeyResponse* resp) {
  const ActivityTracker::Busy busy = activity_.Begin();
  if (absl::StatusOr<Identity> identity =
          Authorize(*ctx, Role::kCompile, "ExplainKey");
      !identity.ok())
    return Done("ExplainKey", ToGrpc(identity.status()));
  auto graph = ImportGraph(req->graph());
  if (!graph.ok()) return Done("ExplainKey", ToGrpc(graph.status()));
  const std::vector<KeyComponent> parts =
      kiln::ExplainKey(*graph, req->target(), req->options());
  for (const KeyComponent& c : parts) {
    auto* out = resp->add_components();
    out->set_name(c.name);
    out->set_canonical(c.canonical);
    out->set_hash(KeyBytes(c.hash));
  }
  const GuardKey request_key = CombineKeyComponents(parts);
  resp->set_guard_key(KeyBytes(request_key));
  resp->set_compiler_identity(identity_);
  resp->set_store_key(KeyBytes(StoreKeyOf(request_key)));
  return Done("ExplainKey", grpc::Status::OK);
}

}  // namespace kiln
