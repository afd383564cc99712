#include "common/tls.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace shardsync {
namespace {

// stdio, not iostreams: see common/daemon_process.cc.
absl::StatusOr<std::string> ReadPem(const std::string& flag, const std::string& path) {
  std::string text;
  if (FILE* file = std::fopen(path.c_str(), "rb")) {
    char block[4096];
    for (size_t n; (n = std::fread(block, 1, sizeof(block), file)) > 0;) text.append(block, n);
    std::fclose(file);
  }
  if (text.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": not a readable PEM file"));
  }
  return text;
}

int Milliseconds(absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); }

}  // namespace

void AddKeepaliveFlags(CLI::App& app, Keepalive& keepalive) {
  flags::AddMilliseconds(app, "--keepalive-ms", keepalive.interval,
                         "ping a TCP connection after this long without traffic (every daemon connection)", 100,
                         600000);
  flags::AddMilliseconds(app, "--keepalive-timeout-ms", keepalive.timeout,
                         "drop a connection whose ping is not answered within this, naming its peer unreachable", 100,
                         600000);
}

void AddTlsFlags(CLI::App& app, TlsConfig& config) {
  constexpr char kGroup[] = "TCP security (mutual TLS, or --insecure: one of them is required)";
  app.add_option("--tls-ca", config.ca_file, "PEM CA: every peer must present a certificate it signed")->group(kGroup);
  app.add_option("--tls-cert", config.cert_file, "PEM certificate of this process (names its host or IP)")
      ->group(kGroup);
  app.add_option("--tls-key", config.key_file, "PEM private key of that certificate")->group(kGroup);
  app.add_option("--tls-server-name", config.server_name,
                 "the name (SAN) every daemon's certificate carries, checked instead of the dialed host "
                 "(default: the dialed host or IP)")
      ->group(kGroup);
  flags::AddSwitch(app, "--insecure", config.insecure, "plaintext TCP, no authentication (only when asked; logged)")
      ->group(kGroup);
}

absl::StatusOr<Credentials> LoadCredentials(const TlsConfig& config, Keepalive keepalive) {
  const int given = !config.ca_file.empty() + !config.cert_file.empty() + !config.key_file.empty();
  if (config.insecure && (given > 0 || !config.server_name.empty()))
    return absl::InvalidArgumentError("--insecure and --tls-* exclude each other");
  if (config.insecure) {
    return Credentials{grpc::InsecureServerCredentials(), grpc::InsecureChannelCredentials(), "", true, keepalive};
  }
  if (given == 0) {
    return absl::InvalidArgumentError(
        "no transport security configured: give --tls-ca, --tls-cert and --tls-key, or --insecure for plaintext");
  }
  if (given < 3) return absl::InvalidArgumentError("TLS needs all of --tls-ca, --tls-cert and --tls-key");
  absl::StatusOr<std::string> ca = ReadPem("tls-ca", config.ca_file);
  absl::StatusOr<std::string> cert = ReadPem("tls-cert", config.cert_file);
  absl::StatusOr<std::string> key = ReadPem("tls-key", config.key_file);
  for (const auto* pem : {&ca, &cert, &key}) {
    if (!pem->ok()) return pem->status();
  }
  grpc::SslServerCredentialsOptions server(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  server.pem_root_certs = *ca;
  server.pem_key_cert_pairs.push_back({*key, *cert});
  grpc::SslCredentialsOptions channel;
  channel.pem_root_certs = *ca;
  channel.pem_private_key = *key;
  channel.pem_cert_chain = *cert;
  return Credentials{grpc::SslServerCredentials(server), grpc::SslCredentials(channel), config.server_name, false,
                     keepalive};
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const Credentials& credentials,
                                           grpc::ChannelArguments args) {
  if (!credentials.server_name.empty()) args.SetSslTargetNameOverride(credentials.server_name);
  // A unix socket is never cut: its peer's end closes when the peer dies.
  if (absl::StartsWith(target, "unix:")) return grpc::CreateCustomChannel(target, credentials.channel, args);
  const int interval = Milliseconds(credentials.keepalive.interval);
  const int timeout = Milliseconds(credentials.keepalive.timeout);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, interval);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, timeout);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS, interval);
  // Reconnecting: attempts at most `interval` apart, each given twice the ping timeout
  // (gRPC's own: up to two minutes apart, 20 s each).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(interval, 100));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, interval);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2 * timeout);
  return grpc::CreateCustomChannel(target, credentials.channel, args);
}

void AddListeningPort(grpc::ServerBuilder& builder, const std::string& address, const Credentials& credentials,
                      int* port) {
  builder.AddListeningPort(address, credentials.server, port);
  const int interval = Milliseconds(credentials.keepalive.interval);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, interval);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Milliseconds(credentials.keepalive.timeout));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Peers ping as often as this server does: accept it, never answer with "too many pings".
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, std::max(interval / 2, 1));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
}

}  // namespace shardsync
