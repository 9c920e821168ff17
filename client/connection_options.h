// ConnectionOptions: TLS files and a token for reaching kilnd, without gRPC
// headers (kiln_client.h includes it). Resolved by client/connection.h,
// which also names the environment variables that fill empty fields.
#ifndef KILN_CLIENT_CONNECTION_OPTIONS_H_
#define KILN_CLIENT_CONNECTION_OPTIONS_H_

#include <string>

namespace kiln {

struct ConnectionOptions {
  std::string token;            // bearer token; empty: token_file, $KILN_TOKEN
  std::string token_file;       // its first line is the token
  bool tls = false;             // TLS even without tls_ca (the system's roots)
  std::string tls_ca;           // PEM file; set: TLS, kilnd verified against it
  std::string tls_cert;         // PEM file: client certificate (mTLS)
  std::string tls_key;          // PEM file: its private key
  std::string tls_server_name;  // expected name in kilnd's certificate
};

}  // namespace kiln

#endif  // KILN_CLIENT_CONNECTION_OPTIONS_H_
