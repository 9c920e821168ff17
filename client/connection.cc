#include "client/connection.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

std::string FromEnv(const std::string& given, const char* variable) {
  if (!given.empty()) return given;
  const char* value = std::getenv(variable);
  return value != nullptr ? value : "";
}

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", what, " '", path, "'"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::StatusOr<Connection> ResolveConnection(const ConnectionOptions& given) {
  ConnectionOptions o = given;
  o.token = FromEnv(o.token, "KILN_TOKEN");
  o.token_file = FromEnv(o.token_file, "KILN_TOKEN_FILE");
  o.tls_ca = FromEnv(o.tls_ca, "KILN_TLS_CA");
  o.tls_cert = FromEnv(o.tls_cert, "KILN_TLS_CERT");
  o.tls_key = FromEnv(o.tls_key, "KILN_TLS_KEY");
  o.tls_server_name = FromEnv(o.tls_server_name, "KILN_TLS_SERVER_NAME");
  if (const char* env = std::getenv("KILN_TLS"); env && std::string(env) == "1")
    o.tls = true;

  Connection c;
  if (o.token.empty() && !o.token_file.empty()) {
    absl::StatusOr<std::string> text = ReadFile(o.token_file, "the token file");
    if (!text.ok()) return text.status();
    const std::string first_line = text->substr(0, text->find('\n'));
    o.token = std::string(absl::StripAsciiWhitespace(first_line));
    if (o.token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the token file '", o.token_file, "' is empty"));
    }
  }
  if (!o.token.empty()) c.authorization = absl::StrCat("Bearer ", o.token);

  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs its key and the reverse (tls_cert with "
        "tls_key, $KILN_TLS_CERT with $KILN_TLS_KEY)");
  }
  c.tls = o.tls || !o.tls_ca.empty() || !o.tls_cert.empty();
  if (!c.tls) {
    c.credentials = grpc::InsecureChannelCredentials();
    return c;
  }
  grpc::SslCredentialsOptions ssl;
  if (!o.tls_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(o.tls_ca, "the TLS CA");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
  }
  if (!o.tls_cert.empty()) {
    absl::StatusOr<std::string> cert =
        ReadFile(o.tls_cert, "the client certificate");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(o.tls_key, "the client key");
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  c.credentials = grpc::SslCredentials(ssl);
  c.tls_server_name = o.tls_server_name;
  return c;
}

std::shared_ptr<grpc::Channel> CreateKilnChannel(const std::string& server,
                                                 const Connection& connection,
                                                 grpc::ChannelArguments args) {
  if (connection.tls && !connection.tls_server_name.empty())
    args.SetSslTargetNameOverride(connection.tls_server_name);
  return grpc::CreateCustomChannel(server, connection.credentials, args);
}

void AddAuthorization(const Connection& connection, grpc::ClientContext* ctx) {
  if (!connection.authorization.empty())
    ctx->AddMetadata("authorization", connection.authorization);
}

}  // namespace kiln
