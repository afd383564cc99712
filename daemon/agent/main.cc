// shardsync-agent: flags parsed here only, into AgentConfig and LinkConfig (and, with
// --serve-coordinator, the CoordinatorConfig of the coordinator it hosts).
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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

int main(int argc, char** argv) {
  shardsync::agent::AgentFlags c;
  CLI::App app(
      "The per-device sidecar: local trainer and rollout clients register their buffers on the unix socket; the "
      "coordinator prepares and executes syncs over TCP; peer agents send chunks to each other.",
      "shardsync-agent");
  shardsync::agent::AddAgentFlags(app, c);
  if (const int code = shardsync::flags::Parse(app, argc, argv); code >= 0) return code;
  if (const std::string error = shardsync::agent::FinishAgentFlags(app, c); !error.empty()) {
    return shardsync::flags::UsageError(app, error);
  }
  const int ordinal = c.ordinal;
  const absl::StatusOr<shardsync::Credentials> credentials = shardsync::LoadCredentials(c.daemon.tls);
  if (!credentials.ok()) return shardsync::flags::UsageError(app, std::string(credentials.status().message()));
  spdlog::set_default_logger(spdlog::stderr_color_mt("agent"));  // stdout is not the log
  spdlog::set_level(spdlog::level::from_str(c.daemon.log_level));
  spdlog::set_pattern(fmt::format("%Y-%m-%d %H:%M:%S.%e agent[{}] %l %v", c.agent.rank));
  if (credentials->insecure)
    spdlog::warn("--insecure: plaintext TCP, anyone who reaches {} may control this agent", c.listen);

  shardsync::BlockStopSignals();
  // Each host buffer keeps a descriptor (its size is checked before every sync): allow as
  // many as the system lets this process have.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }

  // The data path: host memory and the agents' gRPC channels, or one CUDA device and NCCL.
  shardsync::executor::Mailbox mailbox;
  std::unique_ptr<shardsync::executor::MemoryBackend> memory;
  std::unique_ptr<shardsync::executor::Device> device;
  std::unique_ptr<shardsync::executor::Transport> transport;
  // The agents' channels beside NCCL, for host messages to agents on other hosts.
  std::unique_ptr<shardsync::executor::Transport> channels;
  shardsync::executor::DeviceIdentity identity;
  if (ordinal < 0) {
    memory = std::make_unique<shardsync::executor::HostShmBackend>();
    device = std::make_unique<shardsync::executor::HostDevice>();
    transport = std::make_unique<shardsync::agent::GrpcTransport>(c.agent.rank, mailbox, *credentials);
  } else {
    auto cuda = shardsync::executor::CudaDevice::Open(ordinal);
    auto identified = cuda.ok() ? shardsync::executor::IdentifyDevice(ordinal) : cuda.status();
    if (!identified.ok()) {
      spdlog::error("--device {}: {}", ordinal, std::string(identified.status().message()));
      return 1;
    }
    identity = *std::move(identified);
    memory = std::make_unique<shardsync::executor::CudaIpcBackend>(ordinal);
    transport = std::make_unique<shardsync::executor::NcclTransport>(ordinal, (*cuda)->network_stream());
    channels = std::make_unique<shardsync::agent::GrpcTransport>(c.agent.rank, mailbox, *credentials);
    device = *std::move(cuda);
  }
  // Host messages between agents (the agreement, the direct path's completion): this
  // agent's signal board and its peers' on this host, the channels to the others.
  const std::string incarnation = absl::StrCat(getpid(), "-", absl::ToUnixNanos(absl::Now()));
  if (const int removed = shardsync::executor::SignalBoard::RemoveOrphans(); removed > 0) {
    spdlog::info("removed {} signal boards of agents that are gone", removed);
  }
  if (const int removed = shardsync::executor::HostShmBackend::RemoveOrphanScratch(); removed > 0) {
    spdlog::info("removed {} scratch objects of agents that are gone", removed);
  }
  static_assert(shardsync::executor::kBoardRanks >= shardsync::kMaxWorld, "a board holds every rank");
  auto board = shardsync::executor::SignalBoard::Create(shardsync::executor::SignalBoard::NameFor(incarnation));
  if (!board.ok()) {
    spdlog::error("{}", std::string(board.status().message()));
    return 1;
  }
  const absl::Duration board_poll = ordinal < 0 ? absl::ZeroDuration() : absl::FromChrono(shardsync::kPollBeforeSleep);
  std::unique_ptr<shardsync::executor::Transport> signals = std::make_unique<shardsync::executor::BoardTransport>(
      c.agent.rank, **board, channels ? *channels : *transport, board_poll);
  // Tests only (--fault-stall-at-round): the transport stalls one sync at a known round
  // (the agreement and the direct path's completion messages are rounds of `signals`).
  if (c.fault_stall) {
    shardsync::executor::StallFault stall;
    stall.round = c.fault_stall_at_round;
    stall.nth_sync = c.fault_stall_sync;
    stall.on_stall = [](absl::string_view sync_id, int32_t round) {
      spdlog::warn("fault injection: sync {} stalls at round {} until aborted or its deadline", std::string(sync_id),
                   round);
    };
    auto& faulty = c.fault_stall_at_round < 0 ? signals : transport;
    faulty = std::make_unique<shardsync::executor::FaultTransport>(std::move(faulty), std::move(stall));
  }
  shardsync::agent::Registry registry(c.agent.rank, {memory.get()}, c.registrations);
  shardsync::agent::PeerTargets peer_targets(c.agent.rank, registry,
                                             shardsync::agent::PeerTargets::OverGrpc(*credentials));
  const shardsync::agent::DirectPath direct{signals.get(), &peer_targets};
  shardsync::agent::LinkConfig link_config;
  link_config.coordinator = c.coordinator;  // empty with --serve-coordinator: this agent
  link_config.rpc_deadline = c.agent.rpc_deadline;
  link_config.credentials = *credentials;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  link_config.join.set_rank(c.agent.rank);
  link_config.join.set_host(host);
  link_config.join.set_node(c.node.empty() ? host : c.node);
  link_config.join.set_device(c.agent.device);
  link_config.join.set_device_uuid(identity.uuid);
  for (const std::string& uuid : identity.peer_uuids) link_config.join.add_peer_device_uuids(uuid);
  link_config.join.set_fast_agreement(transport->fast_agreement());
  link_config.join.set_incarnation(incarnation);
  link_config.join.set_signal_board((*board)->name());
  shardsync::agent::CoordinatorLink link(link_config, registry);
  shardsync::agent::Agent agent(c.agent, registry, link, *device, *transport, mailbox, direct);
  shardsync::agent::ControlService control(agent);
  std::unique_ptr<shardsync::coordinator::Coordinator> coordinator;
  std::unique_ptr<shardsync::coordinator::CoordinatorService> coordinator_service, local_coordinator_service;
  if (c.serve_coordinator) {
    c.coordinator_config.credentials = *credentials;
    coordinator = std::make_unique<shardsync::coordinator::Coordinator>(c.coordinator_config);
    coordinator->SetLocalAgent(link_config.join.incarnation(),
                               std::make_shared<shardsync::agent::LocalAgentLink>(agent));
    coordinator_service = std::make_unique<shardsync::coordinator::CoordinatorService>(*coordinator);
    // Also on the unix socket: the trainer beside it syncs without TCP or TLS.
    local_coordinator_service = std::make_unique<shardsync::coordinator::CoordinatorService>(*coordinator);
  }

  grpc::EnableDefaultHealthCheckService(true);
  int port = 0;
  grpc::ServerBuilder control_builder;
  control_builder.AddListeningPort(c.listen, credentials->server, &port);
  // The largest message a peer sends is one chunk (a staging slot) and its header.
  // As a coordinator, also the layouts of a large model (64 MiB).
  const int64_t largest_message = std::max<int64_t>(
      shardsync::planner::MaxChunkBytes(c.agent.max_staging_bytes) + (1 << 20), c.serve_coordinator ? 64 << 20 : 0);
  control_builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(largest_message, INT32_MAX)));
  control_builder.RegisterService(&control);
  if (coordinator_service) control_builder.RegisterService(coordinator_service.get());
  std::unique_ptr<grpc::Server> control_server = control_builder.BuildAndStart();
  if (!control_server || port == 0) {
    spdlog::error("cannot listen on {}", c.listen);
    return 1;
  }
  // The unix socket is accepted by LocalSocket, which reads each caller's credentials;
  // its mode and group decide who may register (no TLS on it).
  auto socket = shardsync::agent::LocalSocket::Listen(c.socket, c.socket_group);
  if (!socket.ok()) {
    spdlog::error("{}", std::string(socket.status().message()));
    return 1;
  }
  shardsync::agent::LocalService local(agent, **socket);
  grpc::ServerBuilder local_builder;
  // A registration holds a server thread for its life: bound them with the registrations.
  grpc::ResourceQuota local_quota("local-clients");
  local_quota.SetMaxThreads(c.registrations.clients + 16);
  local_builder.SetResourceQuota(local_quota);
  local_builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(c.max_message_bytes, INT32_MAX)));
  local_builder.RegisterService(&local);
  if (local_coordinator_service) local_builder.RegisterService(local_coordinator_service.get());
  std::unique_ptr<grpc::Server> local_server = local_builder.BuildAndStart();
  if (!local_server) {
    spdlog::error("cannot serve the unix socket {}", c.socket);
    return 1;
  }
  (*socket)->Serve(local_server.get());
  const std::string address =
      c.advertise.empty() ? c.listen.substr(0, c.listen.rfind(':')) + ":" + std::to_string(port) : c.advertise;
  link.Start(address);
  if (!c.port_file.empty() && !shardsync::WritePortFile(c.port_file, port)) {
    spdlog::error("cannot write the port file {}", c.port_file);
    return 1;
  }
  auto metrics = shardsync::StartMetricsIfAsked(c.daemon.metrics_listen, c.daemon.metrics_port_file, [&] {
    return coordinator ? coordinator->Metrics() + agent.Metrics() : agent.Metrics();
  });
  if (!metrics.ok()) {
    spdlog::error("{}", std::string(metrics.status().message()));
    return 1;
  }
  spdlog::info(
      "serving clients on {} and the coordinator and peers on {}{}", c.socket, address,
      coordinator ? absl::StrCat("; the coordinator of a world of ", c.coordinator_config.world_size, " too") : "");

  spdlog::info("stopping on signal {}", shardsync::WaitForStopSignal());
  agent.clients().Shutdown();
  socket->reset();  // no new connections; the file is removed
  local_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  control_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
