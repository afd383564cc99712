#include "common/daemon_process.h"

#include <pthread.h>
#include <signal.h>

#include <cstdio>

#include "common/tls.h"

namespace shardsync {
namespace {

sigset_t StopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

// The flags every daemon takes, after its own in --help.
constexpr char kCommonHelp[] = R"(  --metrics-listen ADDR  serve Prometheus metrics at http://ADDR/metrics (default: off;
                         port 0 lets the OS choose)
  --metrics-port-file P  write the metrics port here once serving
  --log-level L          trace, debug, info (default), warn, error
  --config FILE          settings as "name = value" lines, named like these flags (no
                         "--"); a flag on the command line wins over the file
The standard gRPC health service (grpc.health.v1.Health) answers on every gRPC port.
TCP security, one of them required (the unix socket of an agent is never encrypted):
)";

}  // namespace

int HelpAndConfig(Flags& flags, const char* program, const char* help) {
  if (flags.TakeSwitch("help")) {
    std::fputs(help, stdout);
    std::fputs(kCommonHelp, stdout);
    std::fputs(kTlsHelp, stdout);
    return 0;
  }
  const std::string config = flags.Take("config", "");
  if (!config.empty() && !flags.MergeConfigFile(config)) return DaemonUsage(program, help, flags.error());
  return -1;
}

int DaemonUsage(const char* program, const char* help, const std::string& error) {
  std::fprintf(stderr, "%s: %s\n\n%s%s%s", program, error.c_str(), help, kCommonHelp, kTlsHelp);
  return 2;
}

void BlockStopSignals() {
  const sigset_t signals = StopSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int WaitForStopSignal() {
  const sigset_t signals = StopSignals();
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  return signal_number;
}

// Plain stdio, not iostreams: a GPU agent also loads the shared libstdc++ (NCCL needs
// it) beside the static one of a portable build, and their iostreams do not mix.
bool WritePortFile(const std::string& path, int port) {
  const std::string temporary = path + ".tmp";
  FILE* file = std::fopen(temporary.c_str(), "w");
  if (file == nullptr) return false;
  const bool written = std::fprintf(file, "%d\n", port) > 0;
  return std::fclose(file) == 0 && written && std::rename(temporary.c_str(), path.c_str()) == 0;
}

}  // namespace shardsync
