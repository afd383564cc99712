// shardsync-coordinator: flags parsed here only, into CoordinatorConfig.
#include <cstdio>

#include "common/contract_id.h"
#include "common/daemon_process.h"
#include "common/flags.h"
#include "common/metrics_http.h"
#include "common/tls.h"
#include "daemon/coordinator/coordinator_flags.h"
#include "daemon/coordinator/services.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  shardsync::coordinator::CoordinatorConfig config;
  shardsync::DaemonFlags daemon;
  std::string listen = "127.0.0.1:7070";
  std::string port_file;
  int64_t rpc_deadline_ms = 5000;
  CLI::App app(
      "Plans every parameter once per layout epoch and runs each sync: Prepare on every agent, then Execute only "
      "if all said ok.",
      "shardsync-coordinator");
  shardsync::coordinator::AddCoordinatorFlags(app, config).front()->required();  // --world
  shardsync::flags::AddAddress(app, "--listen", listen,
                               "host:port to serve agents and clients (port 0 lets the OS choose)");
  app.add_option("--port-file", port_file, "write the bound port here once serving (for scripts, tests)");
  shardsync::flags::AddInt<int64_t>(app, "--rpc-deadline-ms", rpc_deadline_ms, "deadline of Prepare and Abort calls", 1,
                                    3600000);
  shardsync::AddDaemonFlags(app, daemon);
  if (const int code = shardsync::flags::Parse(app, argc, argv); code >= 0) return code;
  config.rpc_deadline = absl::Milliseconds(rpc_deadline_ms);
  const absl::StatusOr<shardsync::Credentials> credentials = shardsync::LoadCredentials(daemon.tls, daemon.keepalive);
  if (!credentials.ok()) return shardsync::flags::UsageError(app, std::string(credentials.status().message()));
  config.credentials = *credentials;
  spdlog::set_default_logger(spdlog::stderr_color_mt("coordinator"));  // stdout is not the log
  spdlog::set_level(spdlog::level::from_str(daemon.log_level));
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e coordinator %l %v");
  if (credentials->insecure) spdlog::warn("--insecure: plaintext TCP, anyone who reaches {} may join or sync", listen);

  shardsync::BlockStopSignals();
  shardsync::SkipLockOrderChecksInRelease();

  shardsync::coordinator::Coordinator coordinator(config);
  shardsync::coordinator::CoordinatorService service(coordinator);
  grpc::EnableDefaultHealthCheckService(true);
  int port = 0;
  grpc::ServerBuilder builder;
  shardsync::AddListeningPort(builder, listen, *credentials, &port);
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
  auto metrics = shardsync::StartMetricsIfAsked(daemon.metrics_listen, daemon.metrics_port_file,
                                                [&coordinator] { return coordinator.Metrics(); });
  if (!metrics.ok()) {
    spdlog::error("{}", std::string(metrics.status().message()));
    return 1;
  }
  spdlog::info("serving on port {} for a world of {} agents (contract {})", port, config.world_size,
               shardsync::kContractId);
  spdlog::info("stopping on signal {}", shardsync::WaitForStopSignal());
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}
