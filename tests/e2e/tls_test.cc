// Mutual TLS between the daemons and shardsyncctl, with a CA this test makes with
// openssl: a sync works with certificates, and a peer without a valid one (none, or one
// from another CA) is refused, as is an agent whose certificate names another identity
// than its rank's; plaintext only with --insecure, which warns.
#include <signal.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "tools/localsync/deployment.h"
#include "tools/localsync/temp_dir.h"

namespace shardsync::localsync {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

void Run(const std::string& command) {
  INFO(command);
  REQUIRE(std::system((command + " >/dev/null 2>&1").c_str()) == 0);
}

// A certificate "<dir>/<name>.pem" and ".key" that CA "<dir>/<ca>-ca.pem" signs,
// naming `san` (openssl's subjectAltName syntax).
TlsConfig SignedBy(const std::string& dir, const std::string& ca, const std::string& name, const std::string& san) {
  const std::string base = dir + "/" + name;
  const std::string authority = dir + "/" + ca;
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  Run(absl::StrCat("openssl req ", ec, " -keyout ", base, ".key -out ", base, ".csr -subj /CN=", name));
  std::ofstream(base + ".ext") << "subjectAltName=" << san << "\n";
  Run(absl::StrCat("openssl x509 -req -in ", base, ".csr -CA ", authority, "-ca.pem -CAkey ", authority,
                   "-ca.key -CAcreateserial -days 1 -extfile ", base, ".ext -out ", base, ".pem"));
  TlsConfig tls;
  tls.ca_file = authority + "-ca.pem";
  tls.cert_file = base + ".pem";
  tls.key_file = base + ".key";
  return tls;
}

// A CA "<dir>/<name>-ca.pem" and one certificate it signs, "<dir>/<name>.pem" and
// ".key", naming `san`.
TlsConfig MakeCertificates(const std::string& dir, const std::string& name, const std::string& san) {
  const std::string base = dir + "/" + name;
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  Run(absl::StrCat("openssl req -x509 ", ec, " -keyout ", base, "-ca.key -out ", base,
                   "-ca.pem -days 1 -subj /CN=", name, "-ca"));
  return SignedBy(dir, name, name, san);
}

std::string CertificateFolder() { return MakeTempDir("shardsync-tls-"); }

constexpr char kModel[] = R"({"model": {"tensors": [
    {"name": "embed", "shape": [100, 16], "style": "VOCAB"},
    {"name": "up", "shape": [40, 16], "style": "COLUMN"},
    {"name": "down", "shape": [16, 40], "style": "ROW"},
    {"name": "norm", "shape": [16]}],
  "zero_stage": 3, "dp_ranks": [0, 1], "replicas": [{"ranks": [0, 1]}]}})";

// shardsyncctl status with `flags`; returns (exit code, stdout and stderr).
std::pair<int, std::string> CtlStatus(const Cluster& cluster, const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {"client/cli/shardsyncctl", "status",       "--coordinator",
                                   cluster.coordinator(),     "--timeout-ms", "3000"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const std::string log = cluster.dir() + "/ctl.log";
  Process ctl(argv, log);
  std::string out = ctl.ReadAll(absl::Seconds(20));
  const int code = ctl.Wait(absl::Seconds(20));
  return {code, out + ReadFile(log)};
}

std::vector<std::string> Flags(const TlsConfig& tls) {
  return {"--tls-ca", tls.ca_file, "--tls-cert", tls.cert_file, "--tls-key", tls.key_file};
}

TEST_CASE("with certificates the daemons authenticate each other and sync; a peer without a valid one is refused") {
  const std::string certs = CertificateFolder();
  ClusterOptions options;
  options.agents = 2;
  options.tls = MakeCertificates(certs, "job", "IP:127.0.0.1,DNS:localhost");
  const TlsConfig rogue = MakeCertificates(certs, "rogue", "IP:127.0.0.1,DNS:localhost");
  Cluster cluster(options);
  Deployment deployment(cluster, "tls", kModel, 7);
  for (const std::string& line : deployment.WaitReady()) REQUIRE_THAT(line, StartsWith("ready"));
  auto sync = SyncOnce(cluster, absl::Seconds(20));
  INFO(sync.status().message());
  REQUIRE(sync.ok());
  CHECK(deployment.CheckTargets(7).empty());
  CHECK_THAT(ReadFile(cluster.coordinator_process().log_path()), !Contains("plaintext"));

  auto [ok_code, ok_out] = CtlStatus(cluster, Flags(options.tls));
  INFO(ok_out);
  CHECK(ok_code == 0);
  // No certificate, and one signed by another CA: the handshake fails, nothing answers.
  auto [plain_code, plain_out] = CtlStatus(cluster, {"--insecure"});
  INFO(plain_out);
  CHECK(plain_code != 0);
  CHECK_THAT(plain_out, Contains("UNAVAILABLE"));
  auto [rogue_code, rogue_out] = CtlStatus(cluster, Flags(rogue));
  INFO(rogue_out);
  CHECK(rogue_code != 0);
  CHECK_THAT(rogue_out, Contains("UNAVAILABLE"));

  // An agent with the rogue certificate, then one the job's CA signed for another
  // name, takes rank 1's place: neither can join, each says why in its log, and a sync
  // is refused naming rank 1.
  cluster.agent(1).Signal(SIGKILL);
  cluster.agent(1).Wait(absl::Seconds(5));
  const TlsConfig insider = SignedBy(certs, "job", "insider", "IP:127.0.0.1,DNS:insider.test");
  for (const auto& [who, tls, why] :
       {std::tuple{"rogue", rogue, "cannot join coordinator"}, std::tuple{"insider", insider, "rank 1 is tied to"}}) {
    std::vector<std::string> argv = {"daemon/agent/shardsync-agent",
                                     "--rank",
                                     "1",
                                     "--coordinator",
                                     cluster.coordinator(),
                                     "--socket",
                                     cluster.socket(1),
                                     "--listen",
                                     "127.0.0.1:0"};
    for (const std::string& flag : Flags(tls)) argv.push_back(flag);
    const std::string log = absl::StrCat(cluster.dir(), "/", who, "-agent.log");
    Process agent(argv, log);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (ReadFile(log).find(why) == std::string::npos && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    INFO(ReadFile(log));
    CHECK_THAT(ReadFile(log), Contains("cannot join coordinator") && Contains(why));
  }
  auto refused = SyncOnce(cluster, absl::Seconds(10));
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(std::string(refused.status().message()), Contains("rank 1"));
  std::filesystem::remove_all(certs);
}

TEST_CASE(
    "agent 0 serving the coordinator under TLS: the other agent joins it, a sync over TCP needs a certificate, one "
    "over its unix socket none") {
  const std::string certs = CertificateFolder();
  ClusterOptions options;
  options.agents = 2;
  options.agent0_serves_coordinator = true;
  options.tls = MakeCertificates(certs, "job", "IP:127.0.0.1,DNS:localhost");
  Cluster cluster(options);
  Deployment deployment(cluster, "tls-served", kModel, 13);
  for (const std::string& line : deployment.WaitReady()) REQUIRE_THAT(line, StartsWith("ready"));
  auto sync = SyncOnce(cluster, absl::Seconds(20));  // over TCP, with the job's certificate
  INFO(sync.status().message());
  REQUIRE(sync.ok());
  CHECK(deployment.CheckTargets(13).empty());
  CHECK(CtlStatus(cluster, {"--insecure"}).first != 0);  // plaintext TCP: refused
  deployment.Refill(14);
  TlsConfig plaintext;
  plaintext.insecure = true;
  client::CoordinatorClient beside("unix:" + cluster.socket(0), *LoadCredentials(plaintext));
  auto local = beside.Sync(absl::Seconds(20));
  INFO(local.status().message());
  REQUIRE(local.ok());
  CHECK(deployment.CheckTargets(14).empty());
  std::filesystem::remove_all(certs);
}

TEST_CASE("--tls-server-name: every daemon's certificate carries one service name instead of its address") {
  const std::string certs = CertificateFolder();
  ClusterOptions options;
  options.agents = 2;
  options.tls = MakeCertificates(certs, "service", "DNS:shardsync.test");
  options.tls.server_name = "shardsync.test";
  Cluster cluster(options);
  Deployment deployment(cluster, "named", kModel, 11);
  for (const std::string& line : deployment.WaitReady()) REQUIRE_THAT(line, StartsWith("ready"));
  auto sync = SyncOnce(cluster, absl::Seconds(20));
  INFO(sync.status().message());
  REQUIRE(sync.ok());
  CHECK(deployment.CheckTargets(11).empty());
  // Without the name, the certificate does not match the address dialed.
  auto [code, out] = CtlStatus(cluster, Flags(options.tls));
  INFO(out);
  CHECK(code != 0);
  std::vector<std::string> named = Flags(options.tls);
  named.insert(named.end(), {"--tls-server-name", "shardsync.test"});
  CHECK(CtlStatus(cluster, named).first == 0);
  std::filesystem::remove_all(certs);
}

TEST_CASE(
    "plaintext only when asked: a daemon with neither TLS nor --insecure (true) refuses to start; --insecure warns") {
  const std::string dir = MakeTempDir("shardsync-tls-");
  Process bare({"daemon/coordinator/shardsync-coordinator", "--world", "1"}, dir + "/bare.log");
  CHECK(bare.Wait(absl::Seconds(10)) == 2);
  CHECK_THAT(ReadFile(dir + "/bare.log"), Contains("no transport security configured"));
  // It stops at its flags: the socket is never made.
  Process half({"daemon/agent/shardsync-agent", "--rank", "0", "--coordinator", "127.0.0.1:1", "--socket",
                dir + "/half.sock", "--tls-ca", "/nonexistent.pem"},
               dir + "/half.log");
  CHECK(half.Wait(absl::Seconds(10)) == 2);
  CHECK_THAT(ReadFile(dir + "/half.log"), Contains("TLS needs all of"));

  // --insecure set to false, on the command line or in a config file, is no TLS at all.
  std::FILE* config = std::fopen((dir + "/insecure-false.conf").c_str(), "w");
  REQUIRE(config != nullptr);
  std::fputs("world = 1\ninsecure = false\n", config);
  std::fclose(config);
  const std::vector<std::vector<std::string>> not_insecure = {
      {"--insecure=false"}, {"--insecure=0"}, {"--config", dir + "/insecure-false.conf"}};
  for (const std::vector<std::string>& flags : not_insecure) {
    std::vector<std::string> argv = {"daemon/coordinator/shardsync-coordinator", "--listen", "127.0.0.1:0"};
    if (flags.size() == 1) argv.insert(argv.end(), {"--world", "1"});
    argv.insert(argv.end(), flags.begin(), flags.end());
    Process daemon(argv, dir + "/not-insecure.log");
    INFO(flags.back());
    CHECK(daemon.Wait(absl::Seconds(10)) == 2);
    CHECK_THAT(ReadFile(dir + "/not-insecure.log"), Contains("no transport security configured"));
  }
  // A value that is not a boolean is a usage error, never plaintext.
  for (const std::string bad : {"--insecure=no", "--insecure=2", "--insecure=", "--insecure={}"}) {
    Process daemon({"daemon/coordinator/shardsync-coordinator", "--world", "1", bad}, dir + "/bad-insecure.log");
    INFO(bad);
    CHECK(daemon.Wait(absl::Seconds(10)) == 2);
    CHECK_THAT(ReadFile(dir + "/bad-insecure.log"), Contains("--insecure"));
  }

  ClusterOptions options;
  options.agents = 1;
  Cluster cluster(options);  // no certificates: --insecure
  CHECK_THAT(ReadFile(cluster.coordinator_process().log_path()), Contains("--insecure: plaintext"));
  CHECK_THAT(ReadFile(cluster.agent(0).log_path()), Contains("--insecure: plaintext"));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardsync::localsync
