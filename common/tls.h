// Credentials of every TCP connection between the daemons and from shardsyncctl:
// mutual TLS when a CA, a certificate and a key are configured, plaintext only when
// --insecure asks for it. Neither is an error: nothing falls back on its own.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/flags.h"
#include "grpcpp/channel.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace shardsync {

struct TlsConfig {
  std::string ca_file;      // PEM: the CA every peer's certificate must chain to
  std::string cert_file;    // PEM: this process's certificate (server and client)
  std::string key_file;     // PEM: its private key
  std::string server_name;  // the name every daemon's certificate carries; empty: the dialed host
  bool insecure = false;    // plaintext, asked for explicitly
};

// Adds --tls-ca, --tls-cert, --tls-key, --tls-server-name and --insecure, parsed into
// `config`.
void AddTlsFlags(CLI::App& app, TlsConfig& config);

struct Credentials {
  std::shared_ptr<grpc::ServerCredentials> server;    // requires and verifies client certificates
  std::shared_ptr<grpc::ChannelCredentials> channel;  // presents ours, verifies the server's
  std::string server_name;                            // checked instead of the dialed host
  bool insecure = false;
};

// A channel to `target` with these credentials and `args`.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const Credentials& credentials,
                                           grpc::ChannelArguments args = {});

// Reads the files once. Errors: TLS half configured, unreadable files, both TLS and
// --insecure, or neither.
absl::StatusOr<Credentials> LoadCredentials(const TlsConfig& config);

}  // namespace shardsync
