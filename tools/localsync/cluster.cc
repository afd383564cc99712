#include "tools/localsync/cluster.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"
#include "tools/localsync/temp_dir.h"

namespace shardsync::localsync {
namespace {

// The longest name in Cluster::socket_dir(): "agent<rank>.sock", or a test's own.
constexpr size_t kLongestSocketName = 32;

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

Cluster::Cluster(ClusterOptions options)
    : options_(std::move(options)),
      dir_(MakeTempDir("shardsync-local-")),
      socket_dir_(SocketDirFor(dir_.path(), kLongestSocketName)) {
  TlsConfig tls = options_.tls;
  tls.insecure = tls.ca_file.empty() && tls.cert_file.empty() && tls.key_file.empty();
  absl::StatusOr<Credentials> credentials = LoadCredentials(tls);
  if (!credentials.ok()) throw std::runtime_error(std::string(credentials.status().message()));
  credentials_ = *credentials;
  if (!options_.agent0_serves_coordinator) StartCoordinator("127.0.0.1:0");
  for (int r = 0; r < options_.agents; ++r) {
    StartAgent(r, options_.agent_flags.count(r) ? options_.agent_flags.at(r) : std::vector<std::string>());
  }
  // Agents join on their own thread: wait until the coordinator has all of them.
  client::CoordinatorClient coordinator = coordinator_client();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (true) {
    auto status = coordinator.Status(absl::Seconds(1));
    if (status.ok() && status->agents_size() == options_.agents) break;
    if (absl::Now() > deadline) {
      DumpLogs();
      throw std::runtime_error("the agents did not all join the coordinator");
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

std::vector<std::string> Cluster::security_flags() const {
  const TlsConfig& tls = options_.tls;
  if (credentials_.insecure) return {"--insecure"};
  std::vector<std::string> flags = {"--tls-ca", tls.ca_file, "--tls-cert", tls.cert_file, "--tls-key", tls.key_file};
  if (!tls.server_name.empty()) flags.insert(flags.end(), {"--tls-server-name", tls.server_name});
  return flags;
}

client::CoordinatorClient Cluster::coordinator_client() const {
  return client::CoordinatorClient(coordinator_address_, credentials_);
}

void Cluster::StartCoordinator(const std::string& listen) {
  const std::string port_file = dir_.path() + "/coordinator.port";
  unlink(port_file.c_str());
  std::vector<std::string> argv = {"daemon/coordinator/shardsync-coordinator",
                                   "--world",
                                   std::to_string(options_.agents),
                                   "--listen",
                                   listen,
                                   "--port-file",
                                   port_file,
                                   "--staging-bytes",
                                   std::to_string(options_.staging_bytes),
                                   "--sync-timeout-ms",
                                   std::to_string(options_.sync_timeout_ms),
                                   "--rpc-deadline-ms",
                                   std::to_string(options_.rpc_deadline_ms),
                                   "--log-level",
                                   "debug"};
  if (!options_.relay.empty()) argv.insert(argv.end(), {"--relay", options_.relay});
  if (!options_.direct.empty()) argv.insert(argv.end(), {"--direct", options_.direct});
  if (!options_.delta.empty()) argv.insert(argv.end(), {"--delta", options_.delta});
  if (options_.scratch_bytes > 0) argv.insert(argv.end(), {"--scratch-bytes", std::to_string(options_.scratch_bytes)});
  if (options_.metrics) {
    argv.insert(argv.end(),
                {"--metrics-listen", "127.0.0.1:0", "--metrics-port-file", dir_.path() + "/coordinator.metrics"});
  }
  for (const std::string& flag : security_flags()) argv.push_back(flag);
  coordinator_ = std::make_unique<Process>(argv, dir_.path() + "/coordinator.log");
  const int port = WaitForPortFile(port_file, absl::Seconds(20));
  if (port < 0)
    throw std::runtime_error("the coordinator did not start:\n" + ReadFile(dir_.path() + "/coordinator.log"));
  coordinator_address_ = absl::StrCat("127.0.0.1:", port);
}

void Cluster::RestartCoordinator() {
  coordinator_->Signal(SIGKILL);
  coordinator_->Wait(absl::Seconds(5));
  StartCoordinator(coordinator_address_);
}

Cluster::~Cluster() {
  for (auto& [rank, agent] : agents_) agent->Signal(SIGTERM);
  if (coordinator_) coordinator_->Signal(SIGTERM);
  for (auto& [rank, agent] : agents_) agent->Wait(absl::Seconds(5));
  if (coordinator_) coordinator_->Wait(absl::Seconds(5));
  // A client that was killed leaves its shared memory behind.
  const std::string prefix = ShmPrefix().substr(1);
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0) shm_unlink(("/" + name).c_str());
  }
}

int Cluster::MetricsPort(int rank) const {
  const std::string file =
      rank < 0 ? dir_.path() + "/coordinator.metrics" : absl::StrCat(dir_.path(), "/agent", rank, ".metrics");
  return WaitForPortFile(file, absl::Seconds(10));
}

std::string Cluster::ShmPrefix() const {
  return absl::StrCat("/ss-", std::filesystem::path(dir_.path()).filename().string(), "-");
}

std::string Cluster::socket(int rank) const { return absl::StrCat(socket_dir_.path(), "/agent", rank, ".sock"); }

void Cluster::StartAgent(int rank) { StartAgent(rank, {}); }

void Cluster::StartAgent(int rank, const std::vector<std::string>& extra_flags) {
  const std::string port_file = absl::StrCat(dir_.path(), "/agent", rank, ".port");
  unlink(port_file.c_str());
  const bool serves_coordinator = options_.agent0_serves_coordinator && rank == 0;
  const int port_before = agent_ports_.count(rank) ? agent_ports_.at(rank) : 0;
  std::vector<std::string> argv = {"daemon/agent/shardsync-agent",
                                   "--rank",
                                   std::to_string(rank),
                                   "--socket",
                                   socket(rank),
                                   "--listen",
                                   absl::StrCat("127.0.0.1:", port_before),
                                   "--port-file",
                                   port_file,
                                   "--rpc-deadline-ms",
                                   std::to_string(options_.rpc_deadline_ms),
                                   "--log-level",
                                   "debug"};
  if (serves_coordinator) {
    argv.insert(argv.end(), {"--serve-coordinator", "--world", std::to_string(options_.agents), "--staging-bytes",
                             std::to_string(options_.staging_bytes), "--sync-timeout-ms",
                             std::to_string(options_.sync_timeout_ms)});
    if (!options_.relay.empty()) argv.insert(argv.end(), {"--relay", options_.relay});
    if (!options_.direct.empty()) argv.insert(argv.end(), {"--direct", options_.direct});
    if (!options_.delta.empty()) argv.insert(argv.end(), {"--delta", options_.delta});
    if (!options_.delta.empty()) argv.insert(argv.end(), {"--delta", options_.delta});
    if (options_.scratch_bytes > 0) {
      argv.insert(argv.end(), {"--scratch-bytes", std::to_string(options_.scratch_bytes)});
    }
  } else {
    argv.insert(argv.end(), {"--coordinator", coordinator_address_});
  }
  if (rank < static_cast<int>(options_.nodes.size())) argv.insert(argv.end(), {"--node", options_.nodes[rank]});
  if (options_.metrics) {
    argv.insert(argv.end(), {"--metrics-listen", "127.0.0.1:0", "--metrics-port-file",
                             absl::StrCat(dir_.path(), "/agent", rank, ".metrics")});
  }
  for (const std::string& flag : security_flags()) argv.push_back(flag);
  if (options_.agent_max_staging_bytes.count(rank)) {
    argv.push_back("--max-staging-bytes");
    argv.push_back(std::to_string(options_.agent_max_staging_bytes.at(rank)));
  }
  argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
  agents_[rank] = std::make_unique<Process>(argv, absl::StrCat(dir_.path(), "/agent", rank, ".log"));
  const int port = WaitForPortFile(port_file, absl::Seconds(20));
  if (port < 0) {
    throw std::runtime_error(
        absl::StrCat("agent ", rank, " did not start:\n", ReadFile(absl::StrCat(dir_.path(), "/agent", rank, ".log"))));
  }
  agent_ports_[rank] = port;
  if (serves_coordinator) coordinator_address_ = absl::StrCat("127.0.0.1:", port);
}

Cluster::Client Cluster::StartClient(const std::string& spec, int rank, bool sources, uint64_t seed,
                                     const std::string& extra_flags) {
  const std::string id = absl::StrCat(sources ? "trainer" : "rollout", "-", rank, "-", clients_started_++);
  const std::string prefix = absl::StrCat(ShmPrefix(), id);
  std::vector<std::string> argv = {"tools/localsync/demo_client",
                                   "--socket",
                                   socket(rank),
                                   "--spec",
                                   spec,
                                   "--rank",
                                   std::to_string(rank),
                                   "--role",
                                   sources ? "source" : "target",
                                   "--seed",
                                   std::to_string(seed),
                                   "--shm-prefix",
                                   prefix,
                                   "--client-id",
                                   id};
  for (absl::string_view flag : absl::StrSplit(extra_flags, ' ', absl::SkipEmpty())) argv.emplace_back(flag);
  return Client{std::make_unique<Process>(argv, absl::StrCat(dir_.path(), "/", id, ".log")), prefix};
}

void Cluster::DumpLogs() const {
  for (const auto& entry : std::filesystem::directory_iterator(dir_.path())) {
    if (entry.path().extension() != ".log") continue;
    std::cerr << "---- " << entry.path().filename().string() << "\n" << ReadFile(entry.path().string());
  }
}

}  // namespace shardsync::localsync
