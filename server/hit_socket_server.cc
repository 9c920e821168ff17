#include "server/hit_socket_server.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "spdlog/spdlog.h"

namespace kiln {

absl::StatusOr<std::unique_ptr<HitSocketServer>> HitSocketServer::Start(
    const HitSocketOptions& options, Handler handler) {
  int port = 0;
  absl::StatusOr<hit_wire::UniqueFd> fd =
      hit_wire::Listen(options.listen, &port);
  if (!fd.ok()) return fd.status();
  hit_wire::UniqueFd stop(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop.valid())
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  std::unique_ptr<HitSocketServer> server(
      new HitSocketServer(options, std::move(handler)));
  server->listen_fd_ = *std::move(fd);
  server->stop_fd_ = std::move(stop);
  server->port_ = port;
  absl::string_view path = options.listen;
  if (absl::ConsumePrefix(&path, "unix:"))
    server->unix_path_ = std::string(path);
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

HitSocketServer::HitSocketServer(const HitSocketOptions& options,
                                 Handler handler)
    : options_(options), handler_(std::move(handler)) {}

HitSocketServer::~HitSocketServer() {
  if (stop_fd_.valid()) {
    const uint64_t one = 1;
    (void)!::write(stop_fd_.get(), &one, sizeof(one));
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  // No new connections now; each thread sees stop_fd_ and returns.
  std::list<Connection> all;
  {
    absl::MutexLock lock(&mu_);
    all.swap(connections_);
  }
  for (Connection& c : all) c.thread.join();
  if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
}

void HitSocketServer::AcceptLoop() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0},
                     {stop_fd_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("event=hit_socket_poll_failed error=\"{}\"",
                    std::strerror(errno));
      return;
    }
    if (fds[1].revents & POLLIN) return;
    ReapFinished();
    for (;;) {
      hit_wire::UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr,
                                      SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd.valid()) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          spdlog::warn("event=hit_socket_accept_failed error=\"{}\"",
                       std::strerror(errno));
          // e.g. EMFILE: let connections close before trying again.
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        break;
      }
      if (open_connections_.load() >= options_.max_connections &&
          !CloseAnIdleConnection()) {
        // Closed at once: the client falls back to gRPC.
        spdlog::warn("event=hit_socket_full connections={}",
                     open_connections_.load());
        continue;
      }
      if (unix_path_.empty()) {
        const int one = 1;
        ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      }
      open_connections_.fetch_add(1);
      absl::MutexLock lock(&mu_);
      Connection& c = connections_.emplace_back();
      c.fd = std::move(fd);
      try {
        c.thread = std::thread([this, conn = &c] { Serve(conn); });
      } catch (const std::system_error& e) {
        // No thread to be had (a process limit): this client uses gRPC.
        spdlog::warn("event=hit_socket_thread_failed error=\"{}\"", e.what());
        connections_.pop_back();
        open_connections_.fetch_sub(1);
      }
    }
  }
}

void HitSocketServer::ReapFinished() {
  std::list<Connection> done;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      auto next = std::next(it);
      if (it->finished) done.splice(done.end(), connections_, it);
      it = next;
    }
  }
  for (Connection& c : done) c.thread.join();
}

bool HitSocketServer::CloseAnIdleConnection() {
  // Rounded up: a server of one slot keeps its one idle connection.
  const int64_t keep = static_cast<int64_t>(std::ceil(
      options_.idle_share * static_cast<double>(options_.max_connections)));
  absl::MutexLock lock(&mu_);
  int64_t idle = 0;
  Connection* oldest = nullptr;
  int64_t oldest_since = 0;
  for (Connection& c : connections_) {
    const int64_t since = c.idle_since.load();
    if (since <= 0 || c.finished) continue;
    ++idle;
    if (oldest == nullptr || since < oldest_since) {
      oldest = &c;
      oldest_since = since;
    }
  }
  if (oldest == nullptr || idle <= keep) return false;
  // Lost the race if its next request began meanwhile.
  if (!oldest->idle_since.compare_exchange_strong(oldest_since, kClosing))
    return false;
  // Its thread wakes from poll, reads end-of-file and closes.
  if (oldest->fd.valid()) ::shutdown(oldest->fd.get(), SHUT_RDWR);
  idle_closed_.fetch_add(1);
  spdlog::info("event=hit_socket_idle_closed idle={} keep={}", idle, keep);
  return true;
}

void HitSocketServer::Serve(Connection* connection) {
  const int fd = connection->fd.get();
  std::string request;
  for (;;) {
    char header[hit_wire::kRequestHeaderBytes];
    int64_t since = absl::ToUnixNanos(absl::Now());
    int64_t busy = 0;
    if (!connection->idle_since.compare_exchange_strong(busy, since))
      break;  // chosen to be closed
    absl::Status s = hit_wire::ReadFull(
        fd, header, 1, absl::Now() + options_.idle_timeout, stop_fd_.get());
    // The request has begun: it must arrive whole by `request_deadline`,
    // however slowly its bytes trickle in.
    const absl::Time request_deadline = absl::Now() + options_.io_timeout;
    if (s.ok() && !connection->idle_since.compare_exchange_strong(since, 0))
      break;  // chosen to be closed just as the request began
    if (s.ok()) {
      s = hit_wire::ReadFull(fd, header + 1, sizeof(header) - 1,
                             request_deadline, stop_fd_.get());
    }
    uint32_t length = 0;
    if (s.ok()) s = hit_wire::DecodeRequestHeader(header, &length);
    if (s.ok()) {
      request.resize(length);
      s = hit_wire::ReadFull(fd, request.data(), length, request_deadline,
                             stop_fd_.get());
    }
    if (absl::IsDeadlineExceeded(s) && absl::Now() >= request_deadline &&
        connection->idle_since.load() == 0) {
      timed_out_requests_.fetch_add(1);
      spdlog::info("event=hit_socket_request_timeout timeout_ms={}",
                   absl::ToInt64Milliseconds(options_.io_timeout));
    }
    if (!s.ok()) {
      // A clean close, an idle connection, stopping, or a peer that does not
      // speak the protocol: the connection ends either way.
      if (!absl::IsOutOfRange(s) && !absl::IsCancelled(s))
        spdlog::debug("event=hit_socket_closed status=\"{}\"", s.ToString());
      break;
    }
    const HitReply reply = handler_(request);
    char out[hit_wire::kResponseHeaderBytes];
    std::vector<absl::string_view> pieces;
    pieces.reserve(reply.pieces.size() + 1);
    pieces.push_back(absl::string_view(out, sizeof(out)));
    size_t bytes = 0;
    if (reply.status.ok()) {
      for (absl::string_view p : reply.pieces) bytes += p.size();
      pieces.insert(pieces.end(), reply.pieces.begin(), reply.pieces.end());
    } else {
      bytes = reply.status.message().size();
      pieces.push_back(reply.status.message());
    }
    hit_wire::EncodeResponseHeader(static_cast<uint32_t>(reply.status.code()),
                                   static_cast<uint32_t>(bytes), out);
    // A response under way is finished even when stopping (no stop_fd).
    s = hit_wire::WriteFull(fd, pieces, absl::Now() + options_.io_timeout);
    if (!s.ok()) break;
  }
  absl::MutexLock lock(&mu_);
  connection->fd.reset();
  open_connections_.fetch_sub(1);
  connection->finished = true;
}

}  // namespace kiln
