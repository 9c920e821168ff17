#include "client/kiln_client.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "runtime/cpu_conv.h"
#include "runtime/cpu_executable.h"
#include "client/connection.h"
#include "client/hit_socket_client.h"
#include "client/host_target.h"
#include "client/raw_lookup.h"
#include "runtime/thread_pool.h"
#include "graph/guard_key.h"
#include "graph/import.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "grpcpp/grpcpp.h"
#include "kiln/v1/service.grpc.pb.h"
#include "support/artifact_signature.h"
#include "support/sha256.h"

namespace kiln {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

class CpuExecutableHandle final : public Executable {
 public:
  CpuExecutableHandle(std::unique_ptr<CpuExecutable> exe, std::string key,
                      std::shared_ptr<ThreadPool> pool)
      : exe_(std::move(exe)), key_(std::move(key)), pool_(std::move(pool)) {}
  absl::StatusOr<std::vector<HostTensor>> Run(
      absl::Span<const HostTensor> inputs) const override {
    return exe_->Run(inputs, pool_.get());
  }
  const std::string& guard_key() const override { return key_; }
  const CpuExecutable& cpu_executable() const override { return *exe_; }
  ThreadPool* thread_pool() const override { return pool_.get(); }

 private:
  std::unique_ptr<CpuExecutable> exe_;
  std::string key_;
  std::shared_ptr<ThreadPool> pool_;
};

// One kilnd of the list ClientOptions::server names.
struct Replica {
  Replica(const std::string& address, std::shared_ptr<grpc::Channel> channel,
          bool use_hit_socket, const std::string& authorization)
      : address(address),
        stub(v1::Kiln::NewStub(channel)),
        lookup(channel, address, use_hit_socket, authorization) {}
  const std::string address;
  std::unique_ptr<v1::Kiln::Stub> stub;
  LookupChannel lookup;
  // Until when it is tried last: it answered UNAVAILABLE (unix micros).
  std::atomic<int64_t> avoid_until_micros{0};
};

// How long a replica that answered UNAVAILABLE is tried after the others.
constexpr absl::Duration kAvoidUnavailable = absl::Seconds(5);

class ClientImpl final : public Client {
 public:
  ClientImpl(const ClientOptions& options, Connection connection,
             std::vector<std::unique_ptr<Replica>> replicas,
             TrustedKeys trusted)
      : options_(options),
        connection_(std::move(connection)),
        replicas_(std::move(replicas)),
        trusted_(std::move(trusted)),
        pool_(std::make_shared<ThreadPool>(options.runtime_threads)) {}

  absl::StatusOr<std::shared_ptr<const Executable>> GetExecutable(
      const v1::CompileRequest& request_as_given) override {
    std::optional<v1::CompileRequest> with_target;
    if (request_as_given.target().kind_case() == v1::Target::KIND_NOT_SET) {
      with_target = request_as_given;
      *with_target->mutable_target() = DefaultTarget();
    }
    // Convolutions are oneDNN calls where this runtime loads it. Graphs
    // without one ignore the option (NormalizeOptions drops it from their
    // key and their compile).
    if (!request_as_given.target().has_cuda() &&
        !request_as_given.options().cpu_library_convolutions() &&
        CpuConv::Available()) {
      if (!with_target) with_target = request_as_given;
      with_target->mutable_options()->set_cpu_library_convolutions(true);
    }
    const v1::CompileRequest& request =
        with_target ? *with_target : request_as_given;
    if (request.target().has_cuda()) {
      return absl::UnimplementedError(absl::StrCat(
          "GetExecutable runs CPU artifacts; the request names CUDA target '",
          request.target().cuda().arch(), "': use GetCudaExecutable"));
    }
    absl::StatusOr<std::string> key = KeyOf(request);
    if (!key.ok()) return key.status();
    if (auto local = FindLocal(loaded_, *key)) return local;

    // A hit arrives as the transport's slices; the binary is hashed and
    // written to the memfd from them (no copy), and CpuExecutable verifies
    // its SHA-256 before loading, whichever way the artifact came.
    absl::StatusOr<Fetched> fetched = Fetch(request, *key);
    if (!fetched.ok()) return fetched.status();
    absl::StatusOr<std::unique_ptr<CpuExecutable>> exe =
        fetched->received
            ? CpuExecutable::LoadFromPieces(fetched->received->TakeArtifact(),
                                            fetched->received->binary())
            : CpuExecutable::Load(std::move(fetched->compiled));
    if (!exe.ok()) return exe.status();
    auto handle = std::make_shared<const CpuExecutableHandle>(*std::move(exe),
                                                              *key, pool_);
    std::lock_guard<std::mutex> lock(mu_);
    loaded_[*key] = handle;
    return handle;
  }

  absl::StatusOr<std::shared_ptr<const CudaExecutable>> GetCudaExecutable(
      const v1::CompileRequest& request,
      const CudaLoadOptions& options) override {
    if (!request.target().has_cuda()) {
      return absl::InvalidArgumentError(
          "GetCudaExecutable needs a request with a CUDA target "
          "(target.cuda.arch, e.g. \"sm_90\"); use GetExecutable for CPU "
          "targets");
    }
    if (request.target().cuda().arch().empty()) {
      return absl::InvalidArgumentError(
          "the request's CUDA target names no arch (e.g. \"sm_90\")");
    }
    absl::StatusOr<std::string> key = KeyOf(request);
    if (!key.ok()) return key.status();
    const CudaCacheKey cache_key{*key, options.device_ordinal,
                                 options.allocator.get()};
    if (auto local = FindLocal(loaded_cuda_, cache_key)) return local;

    absl::StatusOr<Fetched> fetched = Fetch(request, *key);
    if (!fetched.ok()) return fetched.status();
    // A CUDA Lookup response is parsed whole (ReceivedArtifact), so both
    // ways give a complete artifact; Load verifies the cubin's SHA-256.
    const v1::Artifact& artifact =
        fetched->received ? fetched->received->artifact() : fetched->compiled;
    absl::StatusOr<std::unique_ptr<CudaExecutable>> exe =
        CudaExecutable::Load(artifact, options);
    if (!exe.ok()) return exe.status();
    std::shared_ptr<const CudaExecutable> loaded = *std::move(exe);
    std::lock_guard<std::mutex> lock(mu_);
    // Two threads that raced here both loaded; the first one stored wins so
    // that every later call sees one executable.
    return loaded_cuda_.emplace(cache_key, std::move(loaded)).first->second;
  }

  Counters counters() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return counters_;
  }

 private:
  // Where a CUDA executable is loaded: a module belongs to one device's
  // context, and the executable allocates through (and keeps alive) one
  // allocator, so the pointer cannot be reused while the entry exists.
  struct CudaCacheKey {
    std::string guard_key;
    int device_ordinal = 0;
    const DeviceAllocator* allocator = nullptr;  // null: the executable's own
    template <typename H>
    friend H AbslHashValue(H h, const CudaCacheKey& k) {
      return H::combine(std::move(h), k.guard_key, k.device_ordinal,
                        k.allocator);
    }
    friend bool operator==(const CudaCacheKey& a, const CudaCacheKey& b) {
      return a.guard_key == b.guard_key &&
             a.device_ordinal == b.device_ordinal && a.allocator == b.allocator;
    }
  };

  // An artifact as the daemon gave it: a Lookup hit still in the received
  // slices (`received`), or a Compile's artifact (`compiled`). Not verified.
  struct Fetched {
    std::optional<ReceivedArtifact> received;
    v1::Artifact compiled;
  };

  // The request key of `request`, computed here exactly as the server does;
  // it does not depend on this client's build (kilnd adds its compiler
  // identity when it stores and looks up). Importing the graph dominates a repeated call (17 ms for a
  // 4 800-node graph), so keys are remembered by the SHA-256 of the
  // request's bytes: equal bytes are an equal request, hence an equal key; a
  // request that serializes differently is only a miss here, never a wrong
  // key. Errors: the graph's import errors (INVALID_ARGUMENT/UNIMPLEMENTED).
  absl::StatusOr<std::string> KeyOf(const v1::CompileRequest& request) {
    std::string request_bytes;
    {
      google::protobuf::io::StringOutputStream stream(&request_bytes);
      google::protobuf::io::CodedOutputStream out(&stream);
      out.SetSerializationDeterministic(true);
      request.SerializeToCodedStream(&out);
    }
    const Sha256Digest fingerprint = Sha256(request_bytes);
    std::string key = FindKey(fingerprint);
    if (key.empty()) {
      auto graph = ImportGraph(request.graph());
      if (!graph.ok()) return graph.status();
      const GuardKey digest =
          ComputeGuardKey(*graph, request.target(), request.options());
      key.assign(reinterpret_cast<const char*>(digest.data()), digest.size());
      RememberKey(fingerprint, key);
    }
    return key;
  }

  // The artifact for `key`: Lookup (the 32-byte key only), and on NOT_FOUND
  // Compile with the whole request; both with retries. Counts lookup_hits
  // and compiles.
  absl::StatusOr<Fetched> Fetch(const v1::CompileRequest& request,
                                const std::string& key) {
    const std::vector<Replica*> order = ReplicasFor(key);
    std::vector<grpc::Slice> response;
    grpc::Status s =
        CallWithRetries(order, [&](Replica& r, grpc::ClientContext* ctx) {
          response.clear();
          return r.lookup.Lookup(ctx, key, &response);
        });
    Fetched fetched;
    if (s.ok()) {
      Count(&Counters::lookup_hits);
      absl::StatusOr<ReceivedArtifact> found =
          ParseLookupResponse(std::move(response));
      if (!found.ok()) return found.status();
      if (!trusted_.empty()) {
        absl::Status v =
            trusted_.Verify(found->ArtifactDigest(), found->signature());
        if (!v.ok()) return Refused(v, key);
      }
      fetched.received.emplace(*std::move(found));
      return fetched;
    }
    if (s.error_code() != grpc::StatusCode::NOT_FOUND) return FromGrpc(s);
    v1::CompileResponse compiled;
    s = CallWithRetries(order, [&](Replica& r, grpc::ClientContext* ctx) {
      return r.stub->Compile(ctx, request, &compiled);
    });
    Count(&Counters::compiles);
    if (!s.ok()) return FromGrpc(s);
    if (!trusted_.empty()) {
      // kilnd signed the serialization it caches; the parsed message
      // serializes back to the same bytes.
      absl::Status v =
          trusted_.Verify(Sha256(compiled.artifact().SerializeAsString()),
                          compiled.artifact_signature());
      if (!v.ok()) return Refused(v, key);
    }
    fetched.compiled = std::move(*compiled.mutable_artifact());
    return fetched;
  }

  // `verify`'s status, naming the server and the key.
  absl::Status Refused(const absl::Status& verify, const std::string& key) {
    Sha256Digest digest{};
    if (key.size() == digest.size())
      std::memcpy(digest.data(), key.data(), digest.size());
    return absl::Status(
        verify.code(),
        absl::StrCat("artifact ", DigestToHex(digest).substr(0, 16), " from ",
                     options_.server, ": ", verify.message()));
  }

  template <typename Map, typename Key>
  typename Map::mapped_type FindLocal(const Map& map, const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map.find(key);
    if (it == map.end()) return nullptr;
    ++counters_.local_hits;
    return it->second;
  }

  // The guard key remembered for a request fingerprint; empty if none.
  std::string FindKey(const Sha256Digest& fingerprint) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = keys_.find(fingerprint);
    return it == keys_.end() ? std::string() : it->second;
  }

  void RememberKey(const Sha256Digest& fingerprint, const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    if (keys_.size() >= kMaxRememberedKeys) keys_.clear();  // stays bounded
    keys_.emplace(fingerprint, key);
  }

  void Count(uint64_t Counters::*field) {
    std::lock_guard<std::mutex> lock(mu_);
    ++(counters_.*field);
  }

  // The replicas in the order `key` tries them: rendezvous hashing (the
  // highest SHA-256 of key + address first), so each key has a home replica
  // and a key's home moves only when its replica leaves the list; replicas
  // that lately answered UNAVAILABLE go last.
  std::vector<Replica*> ReplicasFor(const std::string& key) const {
    std::vector<Replica*> order;
    for (const auto& r : replicas_) order.push_back(r.get());
    if (order.size() == 1) return order;
    std::vector<std::pair<std::string, Replica*>> scored;
    for (Replica* r : order)
      scored.emplace_back(DigestToHex(Sha256(absl::StrCat(key, r->address))),
                          r);
    std::sort(scored.begin(), scored.end(),
              [](const auto& a, const auto& b) { return a.first > b.first; });
    const int64_t now = absl::ToUnixMicros(absl::Now());
    order.clear();
    for (const auto& [score, r] : scored)
      if (r->avoid_until_micros.load() <= now) order.push_back(r);
    for (const auto& [score, r] : scored)
      if (r->avoid_until_micros.load() > now) order.push_back(r);
    return order;
  }

  // Calls `call` on order[0]; on UNAVAILABLE or RESOURCE_EXHAUSTED on the
  // next replica, backing off after each round: max_retries retries after
  // a round of all (one replica: exactly max_retries retries).
  template <typename Fn>
  grpc::Status CallWithRetries(const std::vector<Replica*>& order, Fn call) {
    absl::Duration backoff = options_.initial_backoff;
    const int n = static_cast<int>(order.size());
    for (int attempt = 0;; ++attempt) {
      Replica& replica = *order[attempt % n];
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoSeconds(options_.rpc_deadline));
      AddAuthorization(connection_, &ctx);
      grpc::Status s = call(replica, &ctx);
      const bool unavailable = s.error_code() == grpc::StatusCode::UNAVAILABLE;
      const bool retry =
          unavailable || s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      if (unavailable && n > 1) {
        replica.avoid_until_micros =
            absl::ToUnixMicros(absl::Now() + kAvoidUnavailable);
      }
      if (!retry || attempt >= options_.max_retries + n - 1) return s;
      if ((attempt + 1) % n == 0) {
        std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
        backoff = std::min(backoff * 2, absl::Seconds(10));
      }
    }
  }

  const ClientOptions options_;
  const Connection connection_;
  const std::vector<std::unique_ptr<Replica>> replicas_;
  const TrustedKeys trusted_;
  std::shared_ptr<ThreadPool> pool_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<const Executable>> loaded_;
  absl::flat_hash_map<CudaCacheKey, std::shared_ptr<const CudaExecutable>>
      loaded_cuda_;
  // Request fingerprint (SHA-256 of its deterministic serialization) -> key.
  static constexpr size_t kMaxRememberedKeys = 4096;
  absl::flat_hash_map<Sha256Digest, std::string> keys_;
  Counters counters_;
};

}  // namespace

v1::Target Client::DefaultTarget() {
  v1::Target target;
  *target.mutable_cpu() = HostCpuTargetFromCpuinfo();
  return target;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ClientOptions& options) {
  ClientOptions o = options;
  if (o.server.empty()) {
    const char* env = std::getenv("KILN_SERVER");
    o.server = env && *env ? env : "127.0.0.1:7733";
  }
  if (const char* env = std::getenv("KILN_HIT_SOCKET");
      env && std::string(env) == "0") {
    o.use_hit_socket = false;
  }
  if (o.trusted_keys.empty()) {
    const char* env = std::getenv("KILN_TRUSTED_KEYS");
    if (env != nullptr) o.trusted_keys = env;
  }
  absl::StatusOr<TrustedKeys> trusted = TrustedKeys::Parse(o.trusted_keys);
  if (!trusted.ok()) return trusted.status();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  absl::StatusOr<Connection> connection = ResolveConnection(o.connection);
  if (!connection.ok()) return connection.status();
  std::vector<std::unique_ptr<Replica>> replicas;
  for (absl::string_view address :
       absl::StrSplit(o.server, ',', absl::SkipWhitespace())) {
    const std::string a(absl::StripAsciiWhitespace(address));
    auto channel = CreateKilnChannel(a, *connection, args);
    if (!channel)
      return absl::InvalidArgumentError(
          absl::StrCat("cannot create a channel to '", a, "'"));
    replicas.push_back(std::make_unique<Replica>(
        a, std::move(channel), o.use_hit_socket, connection->authorization));
  }
  if (replicas.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no server address in '", o.server, "'"));
  }
  return std::unique_ptr<Client>(new ClientImpl(
      o, *std::move(connection), std::move(replicas), *std::move(trusted)));
}

}  // namespace kiln
