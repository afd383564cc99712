// shardsync-agent: flags parsed here only, into AgentConfig and LinkConfig (and, with
// --serve-coordinator, the CoordinatorConfig of the coordinator it hosts).
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/contract_id.h"
#include "common/daemon_process.h"
#include "common/flags.h"
#include "common/metrics_http.h"
#include "common/polling.h"
#include "common/tls.h"
#include "daemon/agent/agent.h"
#include "daemon/agent/agent_flags.h"
#include "daemon/agent/grpc_transport.h"
#include "daemon/agent/local_agent_link.h"
#include "daemon/agent/services.h"
#include "daemon/coordinator/coordinator_flags.h"
#include "daemon/coordinator/services.h"
#include "executor/cuda_device.h"
#include "executor/cuda_memory.h"
#include "executor/fault_transport.h"
#include "executor/host_shm.h"
#include "executor/nccl_transport.h"
#include "executor/signal_board.h"
#include "grpcpp/grpcpp.h"
#include "planner/schedule.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace {

using namespace shardsync;

// The data path: host memory and the agents' gRPC channels, or one CUDA device and NCCL
// (then the agents' channels beside it, for host messages to agents on other hosts).
struct DataPath {
  std::unique_ptr<executor::MemoryBackend> memory;
  std::unique_ptr<executor::Device> device;
  std::unique_ptr<executor::Transport> transport;
  std::unique_ptr<executor::Transport> channels;  // GPU agents only
  executor::DeviceIdentity identity;
};

absl::StatusOr<DataPath> OpenDataPath(const agent::AgentFlags& c, executor::Mailbox& mailbox,
                                      agent::PeerChannels& channels) {
  DataPath path;
  if (c.ordinal < 0) {
    path.memory = std::make_unique<executor::HostShmBackend>();
    path.device = std::make_unique<executor::HostDevice>();
    path.transport = std::make_unique<agent::GrpcTransport>(c.agent.rank, mailbox, channels);
    return path;
  }
  auto cuda = executor::CudaDevice::Open(c.ordinal);
  auto identified = cuda.ok() ? executor::IdentifyDevice(c.ordinal) : cuda.status();
  if (!identified.ok())
    return absl::Status(identified.status().code(),
                        absl::StrCat("--device ", c.ordinal, ": ", identified.status().message()));
  path.identity = *std::move(identified);
  path.memory = std::make_unique<executor::CudaIpcBackend>(c.ordinal);
  path.transport = std::make_unique<executor::NcclTransport>(c.ordinal, (*cuda)->network_stream());
  path.channels = std::make_unique<agent::GrpcTransport>(c.agent.rank, mailbox, channels);
  path.device = *std::move(cuda);
  return path;
}

// Host messages between agents (the agreement, the direct path's completion): this
// agent's signal board and its peers' on this host, the channels to the others. With
// --fault-stall-at-round (tests only) the transport or these messages stall one sync at
// a known round.
std::unique_ptr<executor::Transport> HostMessages(const agent::AgentFlags& c, executor::SignalBoard& board,
                                                  DataPath& path) {
  const absl::Duration board_poll = c.ordinal < 0 ? absl::ZeroDuration() : absl::FromChrono(kPollBeforeSleep);
  std::unique_ptr<executor::Transport> signals = std::make_unique<executor::BoardTransport>(
      c.agent.rank, board, path.channels ? *path.channels : *path.transport, board_poll);
  if (c.fault_stall) {
    executor::StallFault stall;
    stall.round = c.fault_stall_at_round;
    stall.nth_sync = c.fault_stall_sync;
    stall.on_stall = [](absl::string_view sync_id, int32_t round) {
      spdlog::warn("fault injection: sync {} stalls at round {} until aborted or its deadline", std::string(sync_id),
                   round);
    };
    auto& faulty = c.fault_stall_at_round < 0 ? signals : path.transport;
    faulty = std::make_unique<executor::FaultTransport>(std::move(faulty), std::move(stall));
  }
  return signals;
}

agent::LinkConfig MakeLinkConfig(const agent::AgentFlags& c, const Credentials& credentials, const DataPath& path,
                                 const std::string& incarnation, const std::string& board) {
  agent::LinkConfig link;
  link.coordinator = c.coordinator;  // empty with --serve-coordinator: this agent
  link.rpc_deadline = c.agent.rpc_deadline;
  link.credentials = credentials;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  link.join.set_rank(c.agent.rank);
  link.join.set_host(host);
  link.join.set_node(c.node.empty() ? host : c.node);
  link.join.set_device(c.agent.device);
  link.join.set_device_uuid(path.identity.uuid);
  for (const std::string& uuid : path.identity.peer_uuids) link.join.add_peer_device_uuids(uuid);
  link.join.set_fast_agreement(path.transport->fast_agreement());
  link.join.set_incarnation(incarnation);
  link.join.set_signal_board(board);
  return link;
}

// Removes what agents that are gone left on this host: signal boards, scratch objects.
void RemoveOrphans() {
  if (const int removed = executor::SignalBoard::RemoveOrphans(); removed > 0) {
    spdlog::info("removed {} signal boards of agents that are gone", removed);
  }
  if (const int removed = executor::HostShmBackend::RemoveOrphanScratch(); removed > 0) {
    spdlog::info("removed {} scratch objects of agents that are gone", removed);
  }
}

// Each host buffer keeps a descriptor (its size is checked before every sync): allow as
// many as the system lets this process have.
void RaiseFileLimit() {
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }
}

// The agent's TCP server for the coordinator and the peers: `services` (null ones
// skipped); `*port` gets the port it listens on. Null if it cannot listen.
std::unique_ptr<grpc::Server> StartControlServer(const agent::AgentFlags& c, const Credentials& credentials,
                                                 std::initializer_list<grpc::Service*> services, int* port) {
  grpc::ServerBuilder builder;
  AddListeningPort(builder, c.listen, credentials, port);
  // The largest message a peer sends is one chunk (a staging slot) and its header.
  // As a coordinator, also the layouts of a large model (64 MiB).
  const int64_t largest_message = std::max<int64_t>(planner::MaxChunkBytes(c.agent.max_staging_bytes) + (1 << 20),
                                                    c.serve_coordinator ? 64 << 20 : 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(largest_message, INT32_MAX)));
  for (grpc::Service* service : services) {
    if (service != nullptr) builder.RegisterService(service);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  return server && *port != 0 ? std::move(server) : nullptr;
}

// The server of the unix socket's local clients: `services` (null ones skipped).
std::unique_ptr<grpc::Server> StartLocalServer(const agent::AgentFlags& c,
                                               std::initializer_list<grpc::Service*> services) {
  grpc::ServerBuilder builder;
  // A registration holds a server thread for its life: bound them with the registrations.
  grpc::ResourceQuota quota("local-clients");
  quota.SetMaxThreads(c.registrations.clients + 16);
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(c.max_message_bytes, INT32_MAX)));
  for (grpc::Service* service : services) {
    if (service != nullptr) builder.RegisterService(service);
  }
  return builder.BuildAndStart();
}

}  // namespace

int main(int argc, char** argv) {
  agent::AgentFlags c;
  CLI::App app(
      "The per-device sidecar: local trainer and rollout clients register their buffers on the unix socket; the "
      "coordinator prepares and executes syncs over TCP; peer agents send chunks to each other.",
      "shardsync-agent");
  agent::AddAgentFlags(app, c);
  if (const int code = flags::Parse(app, argc, argv); code >= 0) return code;
  if (const std::string error = agent::FinishAgentFlags(app, c); !error.empty()) return flags::UsageError(app, error);
  const absl::StatusOr<Credentials> credentials = LoadCredentials(c.daemon.tls, c.daemon.keepalive);
  if (!credentials.ok()) return flags::UsageError(app, std::string(credentials.status().message()));
  spdlog::set_default_logger(spdlog::stderr_color_mt("agent"));  // stdout is not the log
  spdlog::set_level(spdlog::level::from_str(c.daemon.log_level));
  spdlog::set_pattern(fmt::format("%Y-%m-%d %H:%M:%S.%e agent[{}] %l %v", c.agent.rank));
  if (credentials->insecure)
    spdlog::warn("--insecure: plaintext TCP, anyone who reaches {} may control this agent", c.listen);
  BlockStopSignals();
  SkipLockOrderChecksInRelease();
  RaiseFileLimit();
  const auto fail = [](const absl::Status& status) {
    spdlog::error("{}", std::string(status.message()));
    return 1;
  };

  executor::Mailbox mailbox;
  agent::PeerChannels channels(*credentials);
  absl::StatusOr<DataPath> path = OpenDataPath(c, mailbox, channels);
  if (!path.ok()) return fail(path.status());
  const std::string incarnation = agent::NewIncarnation();
  RemoveOrphans();
  static_assert(executor::kBoardRanks >= kMaxWorld, "a board holds every rank");
  // The board's name is seen by every user of the host: this process's, not its incarnation.
  auto board = executor::SignalBoard::Create(
      executor::SignalBoard::NameFor(absl::StrCat(getpid(), "-", absl::ToUnixNanos(absl::Now()))));
  if (!board.ok()) return fail(board.status());
  std::unique_ptr<executor::Transport> signals = HostMessages(c, **board, *path);
  agent::Registry registry(c.agent.rank, {path->memory.get()}, c.registrations);
  const absl::StatusOr<executor::MemorySpan> board_span = (*board)->span();
  if (!board_span.ok()) return fail(board_span.status());
  registry.Reserve(*board_span, "this agent's signal board");
  agent::PeerTargets peer_targets(c.agent.rank, registry, agent::PeerTargets::OverGrpc(channels));
  // Beside the unix socket, with its mode and group: memory passed as descriptors.
  auto descriptors = agent::DescriptorSocket::Listen(
      c.agent.descriptor_socket, c.socket_group,
      [&registry](const std::string& token) { return registry.TargetDescriptors(token); }, {});
  if (!descriptors.ok()) return fail(descriptors.status());
  const agent::LinkConfig link_config = MakeLinkConfig(c, *credentials, *path, incarnation, (*board)->name());
  agent::CoordinatorLink link(link_config, registry);
  agent::Agent agent(c.agent, registry, link, *path->device, *path->transport, mailbox,
                     agent::DirectPath{signals.get(), &peer_targets}, descriptors->get());
  agent::ControlService control(agent);
  std::unique_ptr<coordinator::Coordinator> coordinator;
  std::unique_ptr<coordinator::CoordinatorService> coordinator_service, local_coordinator_service;
  if (c.serve_coordinator) {
    c.coordinator_config.credentials = *credentials;
    coordinator = std::make_unique<coordinator::Coordinator>(c.coordinator_config);
    coordinator->SetLocalAgent(incarnation, std::make_shared<agent::LocalAgentLink>(agent));
    coordinator_service = std::make_unique<coordinator::CoordinatorService>(*coordinator);
    // Also on the unix socket: the trainer beside it syncs without TCP or TLS.
    local_coordinator_service = std::make_unique<coordinator::CoordinatorService>(*coordinator);
  }

  grpc::EnableDefaultHealthCheckService(true);
  int port = 0;
  std::unique_ptr<grpc::Server> control_server =
      StartControlServer(c, *credentials, {&control, coordinator_service.get()}, &port);
  if (!control_server) return fail(absl::UnavailableError(absl::StrCat("cannot listen on ", c.listen)));
  // The unix socket is accepted by LocalSocket, which reads each caller's credentials;
  // its mode and group decide who may register (no TLS on it).
  auto socket = agent::LocalSocket::Listen(c.socket, c.socket_group);
  if (!socket.ok()) return fail(socket.status());
  agent::LocalService local(agent, **socket);
  std::unique_ptr<grpc::Server> local_server = StartLocalServer(c, {&local, local_coordinator_service.get()});
  if (!local_server) return fail(absl::UnavailableError(absl::StrCat("cannot serve the unix socket ", c.socket)));
  (*socket)->Serve(local_server.get());
  const std::string address =
      c.advertise.empty() ? c.listen.substr(0, c.listen.rfind(':')) + ":" + std::to_string(port) : c.advertise;
  link.Start(address);
  if (!c.port_file.empty() && !WritePortFile(c.port_file, port)) {
    return fail(absl::UnavailableError(absl::StrCat("cannot write the port file ", c.port_file)));
  }
  auto metrics = StartMetricsIfAsked(c.daemon.metrics_listen, c.daemon.metrics_port_file, [&] {
    return coordinator ? coordinator->Metrics() + agent.Metrics() : agent.Metrics();
  });
  if (!metrics.ok()) return fail(metrics.status());
  spdlog::info(
      "serving clients on {} and the coordinator and peers on {}{} (contract {})", c.socket, address,
      coordinator ? absl::StrCat("; the coordinator of a world of ", c.coordinator_config.world_size, " too") : "",
      kContractId);

  spdlog::info("stopping on signal {}", WaitForStopSignal());
  agent.clients().Shutdown();
  socket->reset();  // no new connections; the file is removed
  local_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  control_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
