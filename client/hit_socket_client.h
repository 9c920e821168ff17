// Lookup by guard key over the fastest road kilnd offers: its hit socket
// (server/hit_socket_server.h, wire format in support/hit_wire.h) when it
// has one, gRPC's Lookup otherwise.
//
// HitSocketClient speaks the hit socket: a pool of connections, each used
// by one call at a time, kept open between calls. LookupChannel finds the
// hit socket with GetServerInfo on first use and falls back to gRPC (for the
// call, and for a second before it asks again) whenever the socket fails:
// a daemon without one (an older kilnd, --hit_listen=off), a restart, a
// full server. Both return the LookupResponse's bytes as gRPC slices, so
// ParseLookupResponse (client/raw_lookup.h) reads either.
//
//   LookupChannel lookup(channel, "127.0.0.1:7733", /*use_hit_socket=*/true);
//   grpc::ClientContext ctx;  // its deadline bounds the call on either road
//   std::vector<grpc::Slice> slices;
//   grpc::Status s = lookup.Lookup(&ctx, key, &slices);
//
// Thread-safety: both classes may be used from many threads at once.
#ifndef KILN_CLIENT_HIT_SOCKET_CLIENT_H_
#define KILN_CLIENT_HIT_SOCKET_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/raw_lookup.h"
#include "grpcpp/grpcpp.h"
#include "kiln/v1/service.grpc.pb.h"
#include "support/hit_wire.h"

namespace kiln {

class HitSocketClient {
 public:
  // `address`: "HOST:PORT" or "unix:PATH". Connects on first use.
  // `authorization`: "Bearer <token>" for kilnd with tokens, sent in each
  // request (LookupRequest.authorization); empty: none.
  explicit HitSocketClient(std::string address, std::string authorization = "");

  // Sends a LookupRequest for `guard_key`; on OK `*response` holds the
  // LookupResponse's bytes (one slice). Waits at most until `deadline`.
  //
  // Errors: the daemon's status (NOT_FOUND: send Compile;
  // INVALID_ARGUMENT); DEADLINE_EXCEEDED; UNAVAILABLE when the socket
  // failed (cannot connect, closed, not speaking the protocol): use gRPC.
  // A connection kept from an earlier call that turns out closed is
  // replaced once, so a daemon's idle timeout costs no failure.
  absl::Status Lookup(absl::string_view guard_key, absl::Time deadline,
                      std::vector<grpc::Slice>* response);

  const std::string& address() const { return address_; }

 private:
  static constexpr size_t kMaxIdleConnections = 64;

  absl::Status LookupOn(int fd, absl::string_view request, absl::Time deadline,
                        std::vector<grpc::Slice>* response);

  const std::string address_;
  const std::string authorization_;
  absl::Mutex mu_;
  std::vector<hit_wire::UniqueFd> idle_ ABSL_GUARDED_BY(mu_);
};

class LookupChannel {
 public:
  // `target` is the address `channel` was made for; the hit socket is
  // looked for on its host. use_hit_socket=false: gRPC only.
  // `authorization` ("Bearer <token>", or empty) goes with GetServerInfo
  // and each hit-socket request; gRPC Lookups carry what the caller's
  // context holds.
  LookupChannel(std::shared_ptr<grpc::Channel> channel, std::string target,
                bool use_hit_socket, std::string authorization = "");

  // Lookup by `guard_key`, on the hit socket if there is one, else (or when
  // it fails) through gRPC with `ctx`. Returns what RawLookupStub::Lookup
  // does.
  grpc::Status Lookup(grpc::ClientContext* ctx, absl::string_view guard_key,
                      std::vector<grpc::Slice>* response);

  // The hit socket's address in use now; empty while Lookups go through
  // gRPC (for tests and kilnctl).
  std::string hit_socket_address() const;

 private:
  // The hit socket to use now, asking the daemon when it is time; null:
  // use gRPC.
  std::shared_ptr<HitSocketClient> HitSocket(absl::Time deadline);
  void HitSocketFailed();

  const std::string target_;
  const bool use_hit_socket_;
  const std::string authorization_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
  RawLookupStub raw_;
  mutable absl::Mutex mu_;
  std::shared_ptr<HitSocketClient> hit_socket_ ABSL_GUARDED_BY(mu_);
  // When to ask GetServerInfo again (a second after a failure, a minute
  // after the daemon said it has no hit socket).
  absl::Time next_discovery_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace kiln

#endif  // KILN_CLIENT_HIT_SOCKET_CLIENT_H_
