// Every TCP connection between the daemons and from shardsyncctl: its credentials
// (mutual TLS when a CA, a certificate and a key are configured, plaintext only when
// --insecure asks for it; neither is an error: nothing falls back on its own) and how it
// notices a dead peer or a cut link (keepalive).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "grpcpp/channel.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
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

// A TCP connection with nothing heard for `interval` is pinged, and dropped when the
// ping is not answered within `timeout`: its calls fail UNAVAILABLE, on both ends,
// whatever their deadlines. A channel whose connection dropped tries again at most
// `interval` apart (gRPC's own backoff grows to two minutes), each attempt given
// 2 x `timeout`. Unix sockets need none of it.
struct Keepalive {
  absl::Duration interval = absl::Seconds(1);
  absl::Duration timeout = absl::Seconds(2);
};
// Adds --keepalive-ms and --keepalive-timeout-ms, parsed into `keepalive`.
void AddKeepaliveFlags(CLI::App& app, Keepalive& keepalive);

struct Credentials {
  std::shared_ptr<grpc::ServerCredentials> server;    // requires and verifies client certificates
  std::shared_ptr<grpc::ChannelCredentials> channel;  // presents ours, verifies the server's
  std::string server_name;                            // checked instead of the dialed host
  bool insecure = false;
  Keepalive keepalive;  // of every channel made and every port served with these
};

// A channel to `target` with these credentials, their keepalive, and `args`.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const Credentials& credentials,
                                           grpc::ChannelArguments args = {});
// Serves `builder`'s services on `address` with these credentials and their keepalive;
// `*port` gets the bound port once the server is built.
void AddListeningPort(grpc::ServerBuilder& builder, const std::string& address, const Credentials& credentials,
                      int* port);

// Reads the files once. Errors: TLS half configured, unreadable files, both TLS and
// --insecure, or neither.
absl::StatusOr<Credentials> LoadCredentials(const TlsConfig& config, Keepalive keepalive = {});

}  // namespace shardsync
