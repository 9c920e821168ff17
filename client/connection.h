// How a client reaches kilnd when kilnd wants TLS and a token (README.md,
// "Running kilnd for a team"): shared by kiln::Client, kilnctl and the C
// API (and so the Python package).
//
//   ConnectionOptions given;                 // fields left empty come from
//   auto conn = ResolveConnection(given);    // the environment (below)
//   auto channel = CreateKilnChannel("kiln.example.com:7733", *conn, args);
//   grpc::ClientContext ctx;
//   AddAuthorization(*conn, &ctx);           // "authorization: Bearer ..."
//
// Environment, for each field left empty:
//   KILN_TOKEN              the bearer token
//   KILN_TOKEN_FILE         a file whose first line is the token
//   KILN_TLS_CA             PEM CA bundle to verify kilnd with; set: TLS
//   KILN_TLS=1              TLS with the system's roots (no KILN_TLS_CA)
//   KILN_TLS_CERT/KEY       a client certificate and key (mTLS)
//   KILN_TLS_SERVER_NAME    the name to expect in kilnd's certificate
//                           (default: the host of the server address)
//
// The token is sent as gRPC metadata on plaintext channels too (kilnd on
// loopback with tokens): gRPC's call credentials refuse those.
//
// Thread-safety: the functions are reentrant; a Connection is a value.
#ifndef KILN_CLIENT_CONNECTION_H_
#define KILN_CLIENT_CONNECTION_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/connection_options.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace kiln {

// What a channel to kilnd is made with, files read.
struct Connection {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // "Bearer <token>", or empty for none.
  std::string authorization;
  std::string tls_server_name;
  bool tls = false;
};

// Fills `given`'s empty fields from the environment (file comment), reads
// the files and makes the credentials. Errors: NOT_FOUND for a file that
// cannot be read, INVALID_ARGUMENT for an empty token file, a certificate
// without its key (or the reverse), each naming the file or variable.
absl::StatusOr<Connection> ResolveConnection(const ConnectionOptions& given);

// A channel to `server` ("HOST:PORT" or "unix:PATH") with `connection`'s
// credentials and `args` (the server name override added for TLS).
std::shared_ptr<grpc::Channel> CreateKilnChannel(const std::string& server,
                                                 const Connection& connection,
                                                 grpc::ChannelArguments args);

// Adds the token, if any, to a call.
void AddAuthorization(const Connection& connection, grpc::ClientContext* ctx);

}  // namespace kiln

#endif  // KILN_CLIENT_CONNECTION_H_
