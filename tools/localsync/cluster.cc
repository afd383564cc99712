#include "tools/localsync/cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <poll.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/cpp/client.h"

namespace shardsync::localsync {
namespace {

// Under /tmp, not TEST_TMPDIR: a unix socket path must fit in 108 bytes.
std::string TempDir() {
  std::string templ = "/tmp/shardsync-local-XXXXXX";
  return mkdtemp(templ.data());
}

std::string ReadFile(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

Process::Process(const std::vector<std::string>& argv, const std::string& log_path) : log_path_(log_path) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) std::abort();
  pid_ = fork();
  if (pid_ == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(log, 2);
    close(in[1]);
    close(out[0]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  stdin_fd_ = in[1];
  stdout_fd_ = out[0];
  signal(SIGPIPE, SIG_IGN);  // a client that left must not kill the test
}

Process::~Process() {
  if (!exited_) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(5));
  }
  close(stdin_fd_);
  close(stdout_fd_);
}

std::string Process::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const size_t newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return "";
    pollfd fd{stdout_fd_, POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(left)) <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n <= 0) return "";
    buffered_.append(chunk, n);
  }
}

std::string Process::ReadAll(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    pollfd fd{stdout_fd_, POLLIN, 0};
    if (poll(&fd, 1, 50) <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n <= 0) break;
    buffered_.append(chunk, n);
  }
  return std::exchange(buffered_, "");
}

void Process::WriteLine(const std::string& line) {
  const std::string text = line + "\n";
  if (write(stdin_fd_, text.data(), text.size()) < 0) {
    // the process has gone; a later ReadLine or Wait reports it
  }
}

void Process::Signal(int signal) {
  if (!exited_) kill(pid_, signal);
}

int Process::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!exited_) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      exited_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (absl::Now() > deadline) return -1;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return exit_code_;
}

int WaitForPortFile(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream file(path);
    int port = 0;
    if (file >> port && port > 0) return port;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return -1;
}

Cluster::Cluster(ClusterOptions options) : options_(std::move(options)), dir_(TempDir()) {
  TlsConfig tls = options_.tls;
  tls.insecure = tls.ca_file.empty() && tls.cert_file.empty() && tls.key_file.empty();
  absl::StatusOr<Credentials> credentials = LoadCredentials(tls);
  if (!credentials.ok()) throw std::runtime_error(std::string(credentials.status().message()));
  credentials_ = *credentials;
  if (!options_.agent0_serves_coordinator) StartCoordinator("127.0.0.1:0");
  for (int r = 0; r < options_.agents; ++r) StartAgent(r);
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
  const std::string port_file = dir_ + "/coordinator.port";
  unlink(port_file.c_str());
  std::vector<std::string> argv = {"daemon/coordinator/shardsync-coordinator", "--world", std::to_string(options_.agents),
                                   "--listen", listen, "--port-file", port_file, "--staging-bytes",
                                   std::to_string(options_.staging_bytes), "--sync-timeout-ms",
                                   std::to_string(options_.sync_timeout_ms), "--rpc-deadline-ms",
                                   std::to_string(options_.rpc_deadline_ms), "--log-level", "debug"};
  if (!options_.relay.empty()) argv.insert(argv.end(), {"--relay", options_.relay});
  if (options_.metrics) {
    argv.insert(argv.end(), {"--metrics-listen", "127.0.0.1:0", "--metrics-port-file", dir_ + "/coordinator.metrics"});
  }
  for (const std::string& flag : security_flags()) argv.push_back(flag);
  coordinator_ = std::make_unique<Process>(argv, dir_ + "/coordinator.log");
  const int port = WaitForPortFile(port_file, absl::Seconds(20));
  if (port < 0) throw std::runtime_error("the coordinator did not start:\n" + ReadFile(dir_ + "/coordinator.log"));
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
  std::filesystem::remove_all(dir_);
}

int Cluster::MetricsPort(int rank) const {
  const std::string file = rank < 0 ? dir_ + "/coordinator.metrics" : absl::StrCat(dir_, "/agent", rank, ".metrics");
  return WaitForPortFile(file, absl::Seconds(10));
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char chunk[4096];
      ssize_t n;
      while ((n = read(fd, chunk, sizeof(chunk))) > 0) response.append(chunk, n);
    }
  }
  close(fd);
  return response;
}

std::string Cluster::ShmPrefix() const {
  return absl::StrCat("/ss-", std::filesystem::path(dir_).filename().string(), "-");
}

std::string Cluster::socket(int rank) const { return absl::StrCat(dir_, "/agent", rank, ".sock"); }

void Cluster::StartAgent(int rank) {
  const std::string port_file = absl::StrCat(dir_, "/agent", rank, ".port");
  unlink(port_file.c_str());
  const bool serves_coordinator = options_.agent0_serves_coordinator && rank == 0;
  const int port_before = agent_ports_.count(rank) ? agent_ports_.at(rank) : 0;
  std::vector<std::string> argv = {"daemon/agent/shardsync-agent", "--rank", std::to_string(rank), "--socket",
                                   socket(rank), "--listen", absl::StrCat("127.0.0.1:", port_before), "--port-file", port_file,
                                   "--rpc-deadline-ms", std::to_string(options_.rpc_deadline_ms), "--log-level", "debug"};
  if (serves_coordinator) {
    argv.insert(argv.end(), {"--serve-coordinator", "--world", std::to_string(options_.agents), "--staging-bytes",
                             std::to_string(options_.staging_bytes), "--sync-timeout-ms",
                             std::to_string(options_.sync_timeout_ms)});
    if (!options_.relay.empty()) argv.insert(argv.end(), {"--relay", options_.relay});
  } else {
    argv.insert(argv.end(), {"--coordinator", coordinator_address_});
  }
  if (rank < static_cast<int>(options_.nodes.size())) argv.insert(argv.end(), {"--node", options_.nodes[rank]});
  if (options_.metrics) {
    argv.insert(argv.end(), {"--metrics-listen", "127.0.0.1:0", "--metrics-port-file",
                             absl::StrCat(dir_, "/agent", rank, ".metrics")});
  }
  for (const std::string& flag : security_flags()) argv.push_back(flag);
  if (options_.agent_max_staging_bytes.count(rank)) {
    argv.push_back("--max-staging-bytes");
    argv.push_back(std::to_string(options_.agent_max_staging_bytes.at(rank)));
  }
  agents_[rank] = std::make_unique<Process>(argv, absl::StrCat(dir_, "/agent", rank, ".log"));
  const int port = WaitForPortFile(port_file, absl::Seconds(20));
  if (port < 0) {
    throw std::runtime_error(absl::StrCat("agent ", rank, " did not start:\n", ReadFile(absl::StrCat(dir_, "/agent", rank, ".log"))));
  }
  agent_ports_[rank] = port;
  if (serves_coordinator) coordinator_address_ = absl::StrCat("127.0.0.1:", port);
}

Cluster::Client Cluster::StartClient(const std::string& spec, int rank, bool sources, uint64_t seed,
                                     const std::string& extra_flags) {
  const std::string id = absl::StrCat(sources ? "trainer" : "rollout", "-", rank, "-", clients_started_++);
  const std::string prefix = absl::StrCat(ShmPrefix(), id);
  std::vector<std::string> argv = {"tools/localsync/demo_client", "--socket", socket(rank), "--spec", spec,
                                   "--rank", std::to_string(rank), "--role", sources ? "source" : "target",
                                   "--seed", std::to_string(seed), "--shm-prefix", prefix, "--client-id", id};
  for (absl::string_view flag : absl::StrSplit(extra_flags, ' ', absl::SkipEmpty())) argv.emplace_back(flag);
  return Client{std::make_unique<Process>(argv, absl::StrCat(dir_, "/", id, ".log")), prefix};
}

void Cluster::DumpLogs() const {
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    if (entry.path().extension() != ".log") continue;
    std::cerr << "---- " << entry.path().filename().string() << "\n" << ReadFile(entry.path().string());
  }
}

}  // namespace shardsync::localsync
