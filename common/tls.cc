#include "common/tls.h"

#include <cstdio>

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

}  // namespace

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

absl::StatusOr<Credentials> LoadCredentials(const TlsConfig& config) {
  const int given = !config.ca_file.empty() + !config.cert_file.empty() + !config.key_file.empty();
  if (config.insecure && (given > 0 || !config.server_name.empty()))
    return absl::InvalidArgumentError("--insecure and --tls-* exclude each other");
  if (config.insecure) {
    return Credentials{grpc::InsecureServerCredentials(), grpc::InsecureChannelCredentials(), "", true};
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
  return Credentials{grpc::SslServerCredentials(server), grpc::SslCredentials(channel), config.server_name, false};
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, const Credentials& credentials,
                                           grpc::ChannelArguments args) {
  if (!credentials.server_name.empty()) args.SetSslTargetNameOverride(credentials.server_name);
  return grpc::CreateCustomChannel(target, credentials.channel, args);
}

}  // namespace shardsync
