#include "client/hit_socket_client.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

// Largest response accepted: what kiln::Client's gRPC channel accepts.
constexpr uint32_t kMaxResponseBytes = 256u << 20;

// How long gRPC alone is used after the daemon said it has no hit socket
// (it may restart with one).
constexpr absl::Duration kAskAgainAfterNone = absl::Minutes(1);

// A failure of the socket itself, as callers see it: use gRPC.
absl::Status SocketFailed(const absl::Status& s) {
  if (absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s)) return s;
  return absl::UnavailableError(s.message());
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

}  // namespace

HitSocketClient::HitSocketClient(std::string address,
                                 std::string authorization)
    : address_(std::move(address)), authorization_(std::move(authorization)) {}

absl::Status HitSocketClient::Lookup(absl::string_view guard_key,
                                     absl::Time deadline,
                                     std::vector<grpc::Slice>* response) {
  v1::LookupRequest req;
  req.set_guard_key(std::string(guard_key));
  if (!authorization_.empty()) req.set_authorization(authorization_);
  const std::string request = req.SerializeAsString();
  for (int attempt = 0;; ++attempt) {
    hit_wire::UniqueFd fd;
    {
      absl::MutexLock lock(&mu_);
      if (!idle_.empty()) {
        fd = std::move(idle_.back());
        idle_.pop_back();
      }
    }
    const bool reused = fd.valid();
    if (!reused) {
      absl::StatusOr<hit_wire::UniqueFd> connected =
          hit_wire::Connect(address_, deadline);
      if (!connected.ok()) return SocketFailed(connected.status());
      fd = *std::move(connected);
    }
    absl::Status s = LookupOn(fd.get(), request, deadline, response);
    // OK or the daemon's own error: a whole response was read, so the
    // connection is ready for the next request.
    const bool answered =
        s.ok() || (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s));
    if (answered) {
      absl::MutexLock lock(&mu_);
      if (idle_.size() < kMaxIdleConnections) idle_.push_back(std::move(fd));
      return s;
    }
    // A kept connection the daemon has closed since (idle timeout, restart)
    // fails on first use; a fresh one decides.
    if (reused && attempt == 0 && absl::IsUnavailable(s)) continue;
    return s;
  }
}

absl::Status HitSocketClient::LookupOn(int fd, absl::string_view request,
                                       absl::Time deadline,
                                       std::vector<grpc::Slice>* response) {
  char header[hit_wire::kRequestHeaderBytes];
  hit_wire::EncodeRequestHeader(static_cast<uint32_t>(request.size()), header);
  const absl::string_view out[] = {absl::string_view(header, sizeof(header)),
                                   request};
  if (absl::Status s = hit_wire::WriteFull(fd, out, deadline); !s.ok())
    return SocketFailed(s);
  char in[hit_wire::kResponseHeaderBytes];
  uint32_t code = 0;
  uint32_t length = 0;
  absl::Status s = hit_wire::ReadFull(fd, in, sizeof(in), deadline);
  if (s.ok())
    s = hit_wire::DecodeResponseHeader(in, kMaxResponseBytes, &code, &length);
  if (!s.ok()) return SocketFailed(s);
  grpc::Slice payload(static_cast<size_t>(length));
  s = hit_wire::ReadFull(
      fd, reinterpret_cast<char*>(const_cast<uint8_t*>(payload.begin())),
      length, deadline);
  if (!s.ok()) return SocketFailed(s);
  if (code != 0) {
    return absl::Status(
        static_cast<absl::StatusCode>(code),
        absl::string_view(reinterpret_cast<const char*>(payload.begin()),
                          payload.size()));
  }
  response->clear();
  response->push_back(std::move(payload));
  return absl::OkStatus();
}

LookupChannel::LookupChannel(std::shared_ptr<grpc::Channel> channel,
                             std::string target, bool use_hit_socket,
                             std::string authorization)
    : target_(std::move(target)),
      use_hit_socket_(use_hit_socket),
      authorization_(std::move(authorization)),
      stub_(v1::Kiln::NewStub(channel)),
      raw_(channel) {}

grpc::Status LookupChannel::Lookup(grpc::ClientContext* ctx,
                                   absl::string_view guard_key,
                                   std::vector<grpc::Slice>* response) {
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  if (std::shared_ptr<HitSocketClient> hit = HitSocket(deadline)) {
    absl::Status s = hit->Lookup(guard_key, deadline, response);
    if (!absl::IsUnavailable(s)) return ToGrpc(s);
    HitSocketFailed();
  }
  return raw_.Lookup(ctx, guard_key, response);
}

std::string LookupChannel::hit_socket_address() const {
  absl::MutexLock lock(&mu_);
  return hit_socket_ ? hit_socket_->address() : std::string();
}

std::shared_ptr<HitSocketClient> LookupChannel::HitSocket(absl::Time deadline) {
  if (!use_hit_socket_) return nullptr;
  absl::MutexLock lock(&mu_);
  if (hit_socket_ || absl::Now() < next_discovery_) return hit_socket_;
  // Asked at most once a second; until then (or for good, below) gRPC.
  next_discovery_ = absl::Now() + absl::Seconds(1);
  grpc::ClientContext ctx;
  ctx.set_deadline(
      absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(2))));
  if (!authorization_.empty())
    ctx.AddMetadata("authorization", authorization_);
  v1::ServerInfo info;
  const grpc::Status s =
      stub_->GetServerInfo(&ctx, v1::GetServerInfoRequest(), &info);
  if (!s.ok()) {
    // UNIMPLEMENTED: a kilnd from before hit sockets; it may be upgraded.
    if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED)
      next_discovery_ = absl::Now() + kAskAgainAfterNone;
    return nullptr;
  }
  const v1::HitSocket& socket = info.hit_socket();
  std::string host, port;
  if (!socket.unix_path().empty()) {
    // Only a client that reaches gRPC on a Unix socket is on that machine.
    if (absl::StartsWith(target_, "unix:")) {
      hit_socket_ = std::make_shared<HitSocketClient>(
          absl::StrCat("unix:", socket.unix_path()), authorization_);
    }
  } else if (socket.tcp_port() != 0 &&
             hit_wire::SplitHostPort(target_, &host, &port)) {
    hit_socket_ = std::make_shared<HitSocketClient>(
        hit_wire::JoinHostPort(host, static_cast<int>(socket.tcp_port())),
        authorization_);
  }
  if (!hit_socket_) next_discovery_ = absl::Now() + kAskAgainAfterNone;
  return hit_socket_;
}

void LookupChannel::HitSocketFailed() {
  absl::MutexLock lock(&mu_);
  hit_socket_.reset();
  next_discovery_ = absl::Now() + absl::Seconds(1);
}

}  // namespace kiln
