#include "support/hit_wire.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kiln::hit_wire {
namespace {

void PutU32(uint32_t v, char* out) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint32_t GetU32(const char* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i)
    v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

absl::Status Errno(absl::string_view what) {
  const int e = errno;
  if (e == EPIPE || e == ECONNRESET)
    return absl::UnavailableError(absl::StrCat(what, ": connection closed"));
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(e)));
}

// Waits until `fd` is ready for `events`, the deadline passes or `stop_fd`
// becomes readable.
absl::Status Wait(int fd, short events, absl::Time deadline, int stop_fd) {
  for (;;) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration())
      return absl::DeadlineExceededError("hit socket: deadline exceeded");
    // Round up so a sub-millisecond remainder still waits.
    const int64_t ms =
        absl::ToInt64Milliseconds(left + absl::Microseconds(999));
    const int timeout_ms =
        static_cast<int>(std::min<int64_t>(ms, int64_t{1} << 30));
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int n = ::poll(fds, stop_fd >= 0 ? 2 : 1, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("poll");
    }
    if (n == 0) continue;  // re-checks the deadline
    if (stop_fd >= 0 && (fds[1].revents & POLLIN))
      return absl::CancelledError("hit socket: stopping");
    if (fds[0].revents != 0) return absl::OkStatus();
  }
}

}  // namespace

void EncodeRequestHeader(uint32_t length, char out[kRequestHeaderBytes]) {
  std::memcpy(out, kRequestMagic, 4);
  PutU32(length, out + 4);
}

void EncodeResponseHeader(uint32_t code, uint32_t length,
                          char out[kResponseHeaderBytes]) {
  std::memcpy(out, kResponseMagic, 4);
  PutU32(code, out + 4);
  PutU32(length, out + 8);
}

absl::Status DecodeRequestHeader(const char in[kRequestHeaderBytes],
                                 uint32_t* length) {
  if (std::memcmp(in, kRequestMagic, 4) != 0)
    return absl::DataLossError("hit socket: not a Kiln hit request");
  *length = GetU32(in + 4);
  if (*length > kMaxRequestBytes) {
    return absl::DataLossError(absl::StrCat("hit socket: request of ", *length,
                                            " bytes (at most ",
                                            kMaxRequestBytes, ")"));
  }
  return absl::OkStatus();
}

absl::Status DecodeResponseHeader(const char in[kResponseHeaderBytes],
                                  uint32_t max_length, uint32_t* code,
                                  uint32_t* length) {
  if (std::memcmp(in, kResponseMagic, 4) != 0)
    return absl::DataLossError("hit socket: not a Kiln hit response");
  *code = GetU32(in + 4);
  *length = GetU32(in + 8);
  if (*code > 16) {
    return absl::DataLossError(
        absl::StrCat("hit socket: status code ", *code, " out of range"));
  }
  if (*length > max_length) {
    return absl::DataLossError(absl::StrCat("hit socket: response of ", *length,
                                            " bytes (at most ", max_length,
                                            ")"));
  }
  return absl::OkStatus();
}

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

absl::Status ReadFull(int fd, char* buffer, size_t bytes, absl::Time deadline,
                      int stop_fd) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::recv(fd, buffer + done, bytes - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return done == 0 ? absl::OutOfRangeError("hit socket: connection closed")
                       : absl::UnavailableError(
                             "hit socket: connection closed mid-message");
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Errno("recv");
    if (absl::Status s = Wait(fd, POLLIN, deadline, stop_fd); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, absl::Span<const absl::string_view> pieces,
                       absl::Time deadline, int stop_fd) {
  std::vector<iovec> iov;
  iov.reserve(pieces.size());
  for (absl::string_view p : pieces) {
    if (!p.empty()) iov.push_back(iovec{const_cast<char*>(p.data()), p.size()});
  }
  size_t first = 0;
  while (first < iov.size()) {
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Errno("send");
      if (absl::Status s = Wait(fd, POLLOUT, deadline, stop_fd); !s.ok())
        return s;
      continue;
    }
    // Skips what was sent: whole pieces, then part of the next.
    size_t sent = static_cast<size_t>(n);
    while (first < iov.size() && sent >= iov[first].iov_len) {
      sent -= iov[first].iov_len;
      ++first;
    }
    if (sent > 0) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + sent;
      iov[first].iov_len -= sent;
    }
  }
  return absl::OkStatus();
}

bool SplitHostPort(absl::string_view target, std::string* host,
                   std::string* port) {
  for (absl::string_view prefix : {"dns:///", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&target, prefix)) break;
  }
  absl::string_view h;
  absl::string_view p;
  if (absl::ConsumePrefix(&target, "[")) {
    const size_t close = target.find("]:");
    if (close == absl::string_view::npos) return false;
    h = target.substr(0, close);
    p = target.substr(close + 2);
  } else {
    const size_t colon = target.rfind(':');
    if (colon == absl::string_view::npos) return false;
    h = target.substr(0, colon);
    p = target.substr(colon + 1);
    if (absl::StrContains(h, ':')) return false;  // IPv6 needs brackets
  }
  int port_number = 0;
  if (h.empty() || !absl::SimpleAtoi(p, &port_number) || port_number < 0 ||
      port_number > 65535) {
    return false;
  }
  host->assign(h.data(), h.size());
  port->assign(p.data(), p.size());
  return true;
}

std::string JoinHostPort(absl::string_view host, int port) {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

namespace {

// The socket addresses `address` names, as getaddrinfo (or the Unix path)
// gives them, passed to `use` until it returns OK.
template <typename Use>
absl::Status ForEachAddress(absl::string_view address, int ai_flags, Use use) {
  if (absl::ConsumePrefix(&address, "unix:")) {
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    if (address.empty() || address.size() >= sizeof(un.sun_path)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unix socket path must be 1 to ", sizeof(un.sun_path) - 1, " bytes"));
    }
    std::memcpy(un.sun_path, address.data(), address.size());
    return use(AF_UNIX, reinterpret_cast<const sockaddr*>(&un),
               static_cast<socklen_t>(sizeof(un)));
  }
  std::string host, port;
  if (!SplitHostPort(address, &host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected HOST:PORT or unix:PATH, got '", address, "'"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = ai_flags;
  addrinfo* found = nullptr;
  if (int e = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
      e != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(e)));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found,
                                                            &::freeaddrinfo);
  absl::Status last = absl::UnavailableError("no address");
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    last = use(ai->ai_family, ai->ai_addr, ai->ai_addrlen);
    if (last.ok()) return last;
  }
  return last;
}

}  // namespace

absl::StatusOr<UniqueFd> Listen(absl::string_view address, int* bound_port) {
  UniqueFd out;
  *bound_port = 0;
  absl::Status s = ForEachAddress(
      address, AI_PASSIVE,
      [&](int family, const sockaddr* addr, socklen_t len) -> absl::Status {
        UniqueFd fd(
            ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (!fd.valid()) return Errno("socket");
        if (family == AF_UNIX) {
          // A socket file left by a daemon that did not stop cleanly.
          ::unlink(reinterpret_cast<const sockaddr_un*>(addr)->sun_path);
        } else {
          const int one = 1;
          ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        }
        if (::bind(fd.get(), addr, len) != 0) return Errno("bind");
        if (::listen(fd.get(), 128) != 0) return Errno("listen");
        if (family != AF_UNIX) {
          sockaddr_storage bound{};
          socklen_t bound_len = sizeof(bound);
          ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound),
                        &bound_len);
          *bound_port =
              ntohs(bound.ss_family == AF_INET6
                        ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
        }
        out = std::move(fd);
        return absl::OkStatus();
      });
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("listen on ", address, ": ", s.message()));
  }
  return out;
}

absl::StatusOr<UniqueFd> Connect(absl::string_view address,
                                 absl::Time deadline) {
  UniqueFd out;
  absl::Status s = ForEachAddress(
      address, 0,
      [&](int family, const sockaddr* addr, socklen_t len) -> absl::Status {
        UniqueFd fd(
            ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (!fd.valid()) return Errno("socket");
        if (::connect(fd.get(), addr, len) != 0) {
          if (errno != EINPROGRESS && errno != EAGAIN) return Errno("connect");
          if (absl::Status w = Wait(fd.get(), POLLOUT, deadline, -1); !w.ok())
            return w;
          int error = 0;
          socklen_t error_len = sizeof(error);
          ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &error_len);
          if (error != 0) {
            errno = error;
            return Errno("connect");
          }
        }
        if (family != AF_UNIX) {
          const int one = 1;
          ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        out = std::move(fd);
        return absl::OkStatus();
      });
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("connect to ", address, ": ", s.message()));
  }
  return out;
}

}  // namespace kiln::hit_wire
