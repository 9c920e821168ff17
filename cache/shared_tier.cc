#include "cache/shared_tier.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <unistd.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cache/artifact_format.h"
#include "spdlog/spdlog.h"

namespace kiln {
namespace {

// Compare-and-pexpire / compare-and-delete on the lease token (Redis's SET
// page, "Patterns").
constexpr char kRenewScript[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
constexpr char kReleaseScript[] =
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "return redis.call('del', KEYS[1]) else return 0 end";

struct ContextFree {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Connection = std::unique_ptr<redisContext, ContextFree>;
struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyFree>;

std::string Hex(const Sha256Digest& key) { return DigestToHex(key); }

std::string RandomToken() {
  std::random_device rd;
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat(host, ":", getpid(), ":", absl::Hex(rd()),
                      absl::Hex(rd()), absl::Hex(rd()), absl::Hex(rd()));
}

}  // namespace

class SharedTier::Impl {
 public:
  Impl(const SharedTierOptions& options, std::string password)
      : options_(options),
        password_(std::move(password)),
        channel_(absl::StrCat(options.key_prefix, ":published")) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(stop_mu_);
      stop_ = true;
    }
    stop_cv_.notify_all();
    for (std::thread* t : {&reconnector_, &renewer_, &subscriber_})
      if (t->joinable()) t->join();
  }

  absl::Status ParseAddress() {
    absl::string_view a = options_.address;
    if (absl::ConsumePrefix(&a, "unix:")) {
      if (a.empty()) return absl::InvalidArgumentError("empty unix: path");
      unix_path_ = std::string(a);
      return absl::OkStatus();
    }
    absl::ConsumePrefix(&a, "redis://");
    absl::ConsumeSuffix(&a, "/");
    const size_t colon = a.rfind(':');
    int port = 0;
    if (colon == absl::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(a.substr(colon + 1), &port) || port <= 0 ||
        port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--shared_cache: expected redis://HOST:PORT or unix:PATH, got \"",
          options_.address, "\""));
    }
    host_ = std::string(a.substr(0, colon));
    port_ = port;
    return absl::OkStatus();
  }

  void Start() {
    if (auto c = Connect(); c.ok()) {
      Release("", *std::move(c));
      up_ = true;
      spdlog::info("event=shared_cache_up address={}", options_.address);
    } else {
      down_logged_ = true;
      spdlog::warn(
          "event=shared_cache_down address={} status=\"{}\" (serving and "
          "compiling locally; reconnecting in the background)",
          options_.address, c.status().ToString());
    }
    reconnector_ = std::thread([this] { ReconnectLoop(); });
    renewer_ = std::thread([this] { RenewLoop(); });
    subscriber_ = std::thread([this] { SubscribeLoop(); });
  }

  // One command; UNAVAILABLE while down or if the call fails (then the
  // tier goes down); an error reply is INTERNAL and leaves the tier up.
  // Redis Cluster: a MOVED or ASK reply sends the command on to the node
  // it names (at most 3 hops; each call starts at the configured node).
  absl::StatusOr<Reply> Run(std::initializer_list<absl::string_view> args) {
    if (!up_) {
      failures_.fetch_add(1);
      return absl::UnavailableError("the shared cache is down");
    }
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (absl::string_view a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    std::string node;  // empty: the configured address
    bool asking = false;
    for (int hop = 0;; ++hop) {
      absl::StatusOr<Connection> c = Acquire(node);
      if (!c.ok()) {
        MarkDown(c.status().message());
        return c.status();
      }
      if (asking) {
        Reply ok(static_cast<redisReply*>(redisCommand(c->get(), "ASKING")));
        if (!ok) {
          MarkDown((*c)->errstr);
          return absl::UnavailableError("shared cache call failed (ASKING)");
        }
      }
      Reply reply(static_cast<redisReply*>(redisCommandArgv(
          c->get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
      if (!reply) {
        const std::string why = (*c)->errstr;
        MarkDown(why);
        return absl::UnavailableError(
            absl::StrCat("shared cache call failed: ", why));
      }
      Release(node, *std::move(c));
      if (reply->type != REDIS_REPLY_ERROR) return reply;
      const absl::string_view error(reply->str, reply->len);
      // "MOVED <slot> <host:port>" / "ASK <slot> <host:port>"
      const bool moved = absl::StartsWith(error, "MOVED ");
      asking = absl::StartsWith(error, "ASK ");
      const size_t space = error.rfind(' ');
      if ((moved || asking) && hop < 3 && space != absl::string_view::npos) {
        node = std::string(error.substr(space + 1));
        continue;
      }
      failures_.fetch_add(1);
      return absl::InternalError(
          absl::StrCat("shared cache: ", *args.begin(), ": ", error));
    }
  }

  void Notify(absl::string_view key_hex) {
    {
      std::lock_guard<std::mutex> lock(wait_mu_);
      auto it = waiting_.find(key_hex);
      if (it == waiting_.end()) return;
      ++it->second.seq;
    }
    wait_cv_.notify_all();
  }

  void Wait(const std::string& key_hex, absl::Time deadline) {
    const absl::Time until =
        std::min(deadline, absl::Now() + options_.poll_interval);
    std::unique_lock<std::mutex> lock(wait_mu_);
    Waiting& w = waiting_[key_hex];
    ++w.waiters;
    const uint64_t seq = w.seq;
    wait_cv_.wait_until(lock, absl::ToChronoTime(until),
                        [&] { return waiting_[key_hex].seq != seq; });
    if (--waiting_[key_hex].waiters == 0) waiting_.erase(key_hex);
  }

  const SharedTierOptions options_;
  const std::string password_;
  const std::string channel_;
  const std::string token_prefix_ = RandomToken();
  std::string host_, unix_path_;
  int port_ = 0;
  std::atomic<bool> up_{false};
  std::atomic<uint64_t> hits_{0}, misses_{0}, error_hits_{0}, corrupt_{0},
      leases_{0}, published_{0}, bytes_read_{0}, bytes_written_{0},
      failures_{0}, lease_seq_{0};

  std::mutex lease_mu_;
  absl::flat_hash_map<std::string, std::string> held_;  // lease key -> token

 private:
  struct Waiting {
    int waiters = 0;
    uint64_t seq = 0;
  };

  // A connection to `node` ("HOST:PORT" a cluster redirect named; empty:
  // the configured address), authenticated and PINGed.
  absl::StatusOr<Connection> Connect(const std::string& node = "") const {
    const timeval tv = absl::ToTimeval(options_.connect_timeout);
    std::string host = host_;
    int port = port_;
    if (!node.empty()) {
      const size_t colon = node.rfind(':');
      if (colon == std::string::npos ||
          !absl::SimpleAtoi(node.substr(colon + 1), &port))
        return absl::UnavailableError(absl::StrCat("bad redirect ", node));
      host = node.substr(0, colon);
    }
    Connection c(unix_path_.empty() || !node.empty()
                     ? redisConnectWithTimeout(host.c_str(), port, tv)
                     : redisConnectUnixWithTimeout(unix_path_.c_str(), tv));
    if (!c) return absl::UnavailableError("cannot allocate a Redis context");
    if (c->err) {
      return absl::UnavailableError(
          absl::StrCat("connect to ", options_.address, ": ", c->errstr));
    }
    redisSetTimeout(c.get(), absl::ToTimeval(options_.op_timeout));
    auto simple = [&](std::vector<absl::string_view> args) -> absl::Status {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (absl::string_view a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      Reply r(static_cast<redisReply*>(redisCommandArgv(
          c.get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
      if (!r) return absl::UnavailableError(c->errstr);
      if (r->type == REDIS_REPLY_ERROR)
        return absl::PermissionDeniedError(std::string(r->str, r->len));
      return absl::OkStatus();
    };
    if (!password_.empty()) {
      absl::Status s = options_.user.empty()
                           ? simple({"AUTH", password_})
                           : simple({"AUTH", options_.user, password_});
      if (!s.ok())
        return absl::UnavailableError(absl::StrCat("AUTH: ", s.message()));
    }
    if (absl::Status s = simple({"PING"}); !s.ok())
      return absl::UnavailableError(absl::StrCat("PING: ", s.message()));
    return c;
  }

  absl::StatusOr<Connection> Acquire(const std::string& node) {
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      std::vector<Connection>& idle = idle_[node];
      if (!idle.empty()) {
        Connection c = std::move(idle.back());
        idle.pop_back();
        return c;
      }
    }
    return Connect(node);
  }

  void Release(const std::string& node, Connection c) {
    std::lock_guard<std::mutex> lock(pool_mu_);
    std::vector<Connection>& idle = idle_[node];
    if (static_cast<int>(idle.size()) < options_.max_idle_connections)
      idle.push_back(std::move(c));
  }

  void MarkDown(absl::string_view why) {
    failures_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      idle_.clear();
    }
    if (up_.exchange(false) && !down_logged_.exchange(true)) {
      spdlog::warn(
          "event=shared_cache_down address={} reason=\"{}\" (serving and "
          "compiling locally; reconnecting in the background)",
          options_.address, std::string(why));
    }
  }

  // Sleeps `d` or until stopping: false when stopping.
  bool Sleep(absl::Duration d) {
    std::unique_lock<std::mutex> lock(stop_mu_);
    return !stop_cv_.wait_for(lock, absl::ToChronoNanoseconds(d),
                              [this] { return stop_; });
  }

  void ReconnectLoop() {
    while (Sleep(options_.reconnect_interval)) {
      if (up_) continue;
      absl::StatusOr<Connection> c = Connect();
      if (!c.ok()) continue;
      Release("", *std::move(c));
      up_ = true;
      down_logged_ = false;
      spdlog::info("event=shared_cache_up address={}", options_.address);
    }
  }

  void RenewLoop() {
    const std::string ttl_ms =
        absl::StrCat(absl::ToInt64Milliseconds(options_.lease_ttl));
    while (Sleep(options_.lease_ttl / 3)) {
      std::vector<std::pair<std::string, std::string>> held;
      {
        std::lock_guard<std::mutex> lock(lease_mu_);
        held.assign(held_.begin(), held_.end());
      }
      for (const auto& [key, token] : held) {
        absl::StatusOr<Reply> r =
            Run({"EVAL", kRenewScript, "1", key, token, ttl_ms});
        if (r.ok() && (*r)->type == REDIS_REPLY_INTEGER && (*r)->integer == 0) {
          // Expired and possibly taken by another replica: this compile
          // goes on (its result is verified like any), unrenewed.
          spdlog::warn("event=shared_lease_lost key={}", key);
          std::lock_guard<std::mutex> lock(lease_mu_);
          held_.erase(key);
        }
      }
    }
  }

  // Listens on the channel while the tier is up; a lost subscriber only
  // makes waiters fall back to polling.
  void SubscribeLoop() {
    while (Sleep(options_.reconnect_interval)) {
      if (!up_) continue;
      absl::StatusOr<Connection> c = Connect();
      if (!c.ok()) continue;
      redisContext* ctx = c->get();
      Reply r(static_cast<redisReply*>(
          redisCommand(ctx, "SUBSCRIBE %b", channel_.data(), channel_.size())));
      if (!r) continue;
      for (;;) {
        {
          std::lock_guard<std::mutex> lock(stop_mu_);
          if (stop_) return;
        }
        pollfd p{ctx->fd, POLLIN, 0};
        const int n = poll(&p, 1, 200);
        if (n < 0 && errno != EINTR) break;
        if (n <= 0) continue;
        if (redisBufferRead(ctx) != REDIS_OK) break;
        void* raw = nullptr;
        bool broken = false;
        while (redisReaderGetReply(ctx->reader, &raw) == REDIS_OK && raw) {
          Reply msg(static_cast<redisReply*>(raw));
          raw = nullptr;
          if (msg->type == REDIS_REPLY_ARRAY && msg->elements == 3 &&
              msg->element[2]->type == REDIS_REPLY_STRING) {
            Notify(
                absl::string_view(msg->element[2]->str, msg->element[2]->len));
          }
        }
        if (ctx->err) broken = true;
        if (broken) break;
      }
    }
  }

  std::mutex pool_mu_;
  // Idle connections by node ("": the configured address).
  absl::flat_hash_map<std::string, std::vector<Connection>> idle_;
  std::atomic<bool> down_logged_{false};

  std::mutex wait_mu_;
  std::condition_variable wait_cv_;
  absl::flat_hash_map<std::string, Waiting> waiting_;

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread reconnector_, renewer_, subscriber_;
};

absl::StatusOr<std::unique_ptr<SharedTier>> SharedTier::Open(
    const SharedTierOptions& options) {
  std::string password;
  if (!options.password_file.empty()) {
    std::ifstream in(options.password_file);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read the shared cache password file ",
                       options.password_file));
    }
    std::stringstream ss;
    ss << in.rdbuf();
    password = std::string(absl::StripTrailingAsciiWhitespace(ss.str()));
  }
  auto impl = std::make_unique<Impl>(options, std::move(password));
  if (absl::Status s = impl->ParseAddress(); !s.ok()) return s;
  impl->Start();
  return std::unique_ptr<SharedTier>(new SharedTier(std::move(impl)));
}

SharedTier::SharedTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SharedTier::~SharedTier() = default;

bool SharedTier::up() const { return impl_->up_.load(); }

std::string SharedTier::ArtifactKey(const Sha256Digest& key) const {
  return absl::StrCat(impl_->options_.key_prefix, ":{", Hex(key), "}:a");
}
std::string SharedTier::LeaseKey(const Sha256Digest& key) const {
  return absl::StrCat(impl_->options_.key_prefix, ":{", Hex(key), "}:l");
}
std::string SharedTier::ErrorKey(const Sha256Digest& key) const {
  return absl::StrCat(impl_->options_.key_prefix, ":{", Hex(key), "}:e");
}

absl::StatusOr<std::optional<std::string>> SharedTier::GetArtifact(
    const Sha256Digest& key) {
  const std::string name = ArtifactKey(key);
  absl::StatusOr<Reply> r = impl_->Run({"GET", name});
  if (!r.ok()) return r.status();
  if ((*r)->type != REDIS_REPLY_STRING) {
    impl_->misses_.fetch_add(1);
    return std::nullopt;
  }
  const absl::string_view value((*r)->str, (*r)->len);
  impl_->bytes_read_.fetch_add(value.size());
  cache_format::DecodedValue decoded;
  if (absl::Status s = cache_format::DecodeValue(key, value, &decoded);
      !s.ok()) {
    impl_->corrupt_.fetch_add(1);
    spdlog::warn("event=shared_cache_corrupt key={} status=\"{}\"", name,
                 s.ToString());
    (void)impl_->Run({"DEL", name});
    return std::nullopt;
  }
  impl_->hits_.fetch_add(1);
  return std::string(decoded.payload);
}

absl::Status SharedTier::PutArtifact(const Sha256Digest& key,
                                     absl::string_view payload,
                                     double compile_seconds) {
  const std::string value =
      cache_format::EncodeValue(key, payload, compile_seconds, absl::Now());
  absl::StatusOr<Reply> r = impl_->Run({"SET", ArtifactKey(key), value});
  if (!r.ok()) return r.status();
  impl_->published_.fetch_add(1);
  impl_->bytes_written_.fetch_add(value.size());
  return impl_->Run({"PUBLISH", impl_->channel_, Hex(key)}).status();
}

absl::Status SharedTier::DeleteArtifact(const Sha256Digest& key) {
  impl_->corrupt_.fetch_add(1);
  return impl_->Run({"DEL", ArtifactKey(key)}).status();
}

absl::StatusOr<std::optional<absl::Status>> SharedTier::GetError(
    const Sha256Digest& key) {
  absl::StatusOr<Reply> r = impl_->Run({"GET", ErrorKey(key)});
  if (!r.ok()) return r.status();
  if ((*r)->type != REDIS_REPLY_STRING) return std::nullopt;
  const absl::string_view value((*r)->str, (*r)->len);
  const size_t space = value.find(' ');
  int code = 0;
  if (space == absl::string_view::npos ||
      !absl::SimpleAtoi(value.substr(0, space), &code) || code <= 0 ||
      code > 16) {
    impl_->corrupt_.fetch_add(1);
    (void)impl_->Run({"DEL", ErrorKey(key)});
    return std::nullopt;
  }
  impl_->error_hits_.fetch_add(1);
  // Wrapped explicitly: a bare Status would make the StatusOr an error.
  return std::optional<absl::Status>(absl::Status(
      static_cast<absl::StatusCode>(code),
      absl::StrCat(value.substr(space + 1), " (cached by the fleet)")));
}

absl::Status SharedTier::PutError(const Sha256Digest& key,
                                  const absl::Status& error) {
  const std::string value =
      absl::StrCat(static_cast<int>(error.code()), " ", error.message());
  const std::string ttl =
      absl::StrCat(absl::ToInt64Milliseconds(impl_->options_.error_ttl));
  absl::StatusOr<Reply> r =
      impl_->Run({"SET", ErrorKey(key), value, "PX", ttl});
  if (!r.ok()) return r.status();
  return impl_->Run({"PUBLISH", impl_->channel_, Hex(key)}).status();
}

absl::StatusOr<bool> SharedTier::TryLease(const Sha256Digest& key) {
  const std::string name = LeaseKey(key);
  const std::string token =
      absl::StrCat(impl_->token_prefix_, ":", impl_->lease_seq_.fetch_add(1));
  const std::string ttl =
      absl::StrCat(absl::ToInt64Milliseconds(impl_->options_.lease_ttl));
  absl::StatusOr<Reply> r = impl_->Run({"SET", name, token, "NX", "PX", ttl});
  if (!r.ok()) return r.status();
  if ((*r)->type == REDIS_REPLY_NIL) return false;
  impl_->leases_.fetch_add(1);
  std::lock_guard<std::mutex> lock(impl_->lease_mu_);
  impl_->held_[name] = token;
  return true;
}

void SharedTier::ReleaseLease(const Sha256Digest& key) {
  const std::string name = LeaseKey(key);
  std::string token;
  {
    std::lock_guard<std::mutex> lock(impl_->lease_mu_);
    auto it = impl_->held_.find(name);
    if (it == impl_->held_.end()) return;
    token = std::move(it->second);
    impl_->held_.erase(it);
  }
  // Best effort: a lease not deleted expires by itself.
  (void)impl_->Run({"EVAL", kReleaseScript, "1", name, token});
}

void SharedTier::WaitForPublish(const Sha256Digest& key, absl::Time deadline) {
  impl_->Wait(Hex(key), deadline);
}

SharedTierStats SharedTier::Stats() const {
  SharedTierStats s;
  s.up = impl_->up_.load();
  s.hits = impl_->hits_.load();
  s.misses = impl_->misses_.load();
  s.error_hits = impl_->error_hits_.load();
  s.corrupt = impl_->corrupt_.load();
  s.leases = impl_->leases_.load();
  s.published = impl_->published_.load();
  s.bytes_read = impl_->bytes_read_.load();
  s.bytes_written = impl_->bytes_written_.load();
  s.failures = impl_->failures_.load();
  return s;
}

}  // namespace kiln
