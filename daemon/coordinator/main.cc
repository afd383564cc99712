// shardsync-coordinator: flags parsed here only, into CoordinatorConfig.
#include <cstdio>

#include "common/daemon_process.h"
#include "common/flags.h"
#include "common/metrics_http.h"
#include "common/tls.h"
#include "daemon/coordinator/planning_flags.h"
#include "daemon/coordinator/services.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace {

constexpr char kHelp[] = R"(usage: shardsync-coordinator --world N [FLAGS]

Plans every parameter once per layout epoch and runs each sync: Prepare on every
agent, then Execute only if all said ok.

  --world N              number of agents (ranks 0..N-1), required
  --listen ADDR          host:port to serve agents and clients (default 127.0.0.1:7070;
                         port 0 lets the OS choose)
  --port-file PATH       write the bound port here once serving (for scripts, tests)
  --staging-bytes B      staging budget per peer, both directions (default 134217728)
  --rpc-deadline-ms N    deadline of Prepare and Abort calls (default 5000)
  --sync-timeout-ms N    default deadline of a sync's Execute (default 60000)
)";

const char* Help() {
  static const std::string help = std::string(kHelp) + shardsync::coordinator::kPlanningHelp;
  return help.c_str();
}

int Usage(const std::string& error) { return shardsync::DaemonUsage("shardsync-coordinator", Help(), error); }

}  // namespace

int main(int argc, char** argv) {
  shardsync::Flags flags(argc, argv, 1);
  if (const int code = shardsync::HelpAndConfig(flags, "shardsync-coordinator", Help()); code >= 0) return code;
  shardsync::coordinator::CoordinatorConfig config;
  config.world_size = flags.TakeNumber("world", 0);
  const shardsync::TlsConfig tls = shardsync::TakeTlsFlags(flags);
  const std::string listen = flags.Take("listen", "127.0.0.1:7070");
  const std::string port_file = flags.Take("port-file", "");
  config.staging_bytes = flags.TakeNumber("staging-bytes", config.staging_bytes);
  config.rpc_deadline = absl::Milliseconds(flags.TakeNumber("rpc-deadline-ms", 5000));
  config.sync_timeout = absl::Milliseconds(flags.TakeNumber("sync-timeout-ms", 60000));
  const std::string log_level = flags.Take("log-level", "info");
  const std::string metrics_listen = flags.Take("metrics-listen", "");
  const std::string metrics_port_file = flags.Take("metrics-port-file", "");
  const std::string planning = shardsync::coordinator::TakePlanningFlags(flags, config);
  if (!flags.error().empty()) return Usage(flags.error());
  if (!planning.empty()) return Usage(planning);
  if (!flags.Leftover().empty()) return Usage(flags.Leftover());
  if (config.world_size < 1) return Usage("--world must be at least 1");
  if (config.staging_bytes < 1) return Usage("--staging-bytes must be positive");
  const absl::StatusOr<shardsync::Credentials> credentials = shardsync::LoadCredentials(tls);
  if (!credentials.ok()) return Usage(std::string(credentials.status().message()));
  config.credentials = *credentials;
  spdlog::set_default_logger(spdlog::stderr_color_mt("coordinator"));  // stdout is not the log
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e coordinator %l %v");
  if (credentials->insecure) spdlog::warn("--insecure: plaintext TCP, anyone who reaches {} may join or sync", listen);

  shardsync::BlockStopSignals();

  shardsync::coordinator::Coordinator coordinator(config);
  shardsync::coordinator::CoordinatorService service(coordinator);
  grpc::EnableDefaultHealthCheckService(true);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, credentials->server, &port);
  builder.SetMaxReceiveMessageSize(64 << 20);  // layouts of large models; nothing bigger
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    spdlog::error("cannot listen on {}", listen);
    return 1;
  }
  if (!port_file.empty() && !shardsync::WritePortFile(port_file, port)) {
    spdlog::error("cannot write the port file {}", port_file);
    return 1;
  }
  auto metrics = shardsync::StartMetricsIfAsked(metrics_listen, metrics_port_file,
                                                [&coordinator] { return coordinator.Metrics(); });
  if (!metrics.ok()) {
    spdlog::error("{}", std::string(metrics.status().message()));
    return 1;
  }
  spdlog::info("serving on port {} for a world of {} agents", port, config.world_size);
  spdlog::info("stopping on signal {}", shardsync::WaitForStopSignal());
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
