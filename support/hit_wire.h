// The hit socket's wire format and the blocking socket I/O both ends use.
//
// kilnd answers Lookup on its gRPC port and, faster, on a hit socket of its
// own (server/hit_socket_server.h): on loopback a gRPC unary call costs two
// HTTP/2 stacks and several thread hand-offs per hit, while a hit needs one
// request of ~40 bytes and one response carrying the artifact. The protocol
// is Lookup and nothing else, over a stream socket (TCP or Unix):
//
//   request   "KLQ1"  u32 length  LookupRequest bytes   (length <= 4 KiB)
//   response  "KLR1"  u32 code    u32 length  payload
//
// Integers are little-endian. `code` is a google.rpc code (0 OK, 5
// NOT_FOUND, ...); the payload is the LookupResponse bytes when code is 0
// (exactly what gRPC's Lookup returns), else a UTF-8 error message. A
// connection carries any number of request/response pairs in order. Either
// side closes a connection on anything it cannot parse; the client then
// uses gRPC. A new version gets a new magic.
//
// Thread-safety: the functions are reentrant; an fd is used by one thread.
#ifndef KILN_SUPPORT_HIT_WIRE_H_
#define KILN_SUPPORT_HIT_WIRE_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace kiln::hit_wire {

inline constexpr char kRequestMagic[4] = {'K', 'L', 'Q', '1'};
inline constexpr char kResponseMagic[4] = {'K', 'L', 'R', '1'};
inline constexpr size_t kRequestHeaderBytes = 8;
inline constexpr size_t kResponseHeaderBytes = 12;
inline constexpr uint32_t kMaxRequestBytes = 4096;

void EncodeRequestHeader(uint32_t length, char out[kRequestHeaderBytes]);
void EncodeResponseHeader(uint32_t code, uint32_t length,
                          char out[kResponseHeaderBytes]);
// Errors: DATA_LOSS for a wrong magic or a length above the limit.
absl::Status DecodeRequestHeader(const char in[kRequestHeaderBytes],
                                 uint32_t* length);
absl::Status DecodeResponseHeader(const char in[kResponseHeaderBytes],
                                  uint32_t max_length, uint32_t* code,
                                  uint32_t* length);

// An owned file descriptor, closed when destroyed. Movable.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// A listening socket at `address`: "HOST:PORT" (IPv4, [IPv6] or a name;
// port 0 picks a free one, returned in *bound_port) or "unix:PATH" (a stale
// socket file at PATH is replaced). Non-blocking, close-on-exec.
// Errors: INVALID_ARGUMENT for an address of another form; UNAVAILABLE when
// it cannot be bound.
absl::StatusOr<UniqueFd> Listen(absl::string_view address, int* bound_port);

// A connected, non-blocking, close-on-exec stream socket to `address` (the
// forms Listen takes), with TCP_NODELAY; waits at most until `deadline`.
// Errors: INVALID_ARGUMENT for a malformed address, UNAVAILABLE when it
// cannot connect, DEADLINE_EXCEEDED.
absl::StatusOr<UniqueFd> Connect(absl::string_view address,
                                 absl::Time deadline);

// Splits "HOST:PORT" / "[V6]:PORT" (also with gRPC's "dns:///", "ipv4:" and
// "ipv6:" prefixes) into host and port; false for anything else.
bool SplitHostPort(absl::string_view target, std::string* host,
                   std::string* port);

// "HOST:PORT", with IPv6 hosts in brackets: what SplitHostPort splits.
std::string JoinHostPort(absl::string_view host, int port);

// Reads exactly `bytes` bytes into `buffer` from a non-blocking socket,
// waiting at most until `deadline`; if `stop_fd` >= 0, gives up as soon as
// it becomes readable. Errors: UNAVAILABLE when the peer closed the
// connection (OUT_OF_RANGE instead when it closed before the first byte,
// the clean end of a connection), DEADLINE_EXCEEDED, CANCELLED (stop_fd),
// or the socket's error.
absl::Status ReadFull(int fd, char* buffer, size_t bytes, absl::Time deadline,
                      int stop_fd = -1);

// Writes every byte of `pieces`, in order, to a non-blocking socket (no
// SIGPIPE), waiting at most until `deadline`. Errors as ReadFull's.
absl::Status WriteFull(int fd, absl::Span<const absl::string_view> pieces,
                       absl::Time deadline, int stop_fd = -1);

}  // namespace kiln::hit_wire

#endif  // KILN_SUPPORT_HIT_WIRE_H_
