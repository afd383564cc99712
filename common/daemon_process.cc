#include "common/daemon_process.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>

#include "absl/synchronization/mutex.h"
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

}  // namespace

void AddDaemonFlags(CLI::App& app, DaemonFlags& flags) {
  flags::AddAddress(app, "--metrics-listen", flags.metrics_listen,
                    "serve Prometheus metrics at http://ADDR/metrics (default: off; port 0 lets the OS choose)");
  app.add_option("--metrics-port-file", flags.metrics_port_file, "write the metrics port here once serving");
  flags::AddLogLevel(app, flags.log_level);
  flags::AddConfigFile(app);
  AddTlsFlags(app, flags.tls);
  AddKeepaliveFlags(app, flags.keepalive);
  app.footer(
      "The standard gRPC health service (grpc.health.v1.Health) answers on every gRPC port. The unix socket "
      "of an agent is never encrypted.");
}

void BlockStopSignals() {
  const sigset_t signals = StopSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

void SkipLockOrderChecksInRelease() {
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
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
  // The rename would replace whatever is there: a device (/dev/null) or a directory is
  // not a port file.
  if (struct stat existing{}; lstat(path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode)) return false;
  const std::string temporary = path + ".tmp";
  FILE* file = std::fopen(temporary.c_str(), "w");
  if (file == nullptr) return false;
  const bool written = std::fprintf(file, "%d\n", port) > 0;
  return std::fclose(file) == 0 && written && std::rename(temporary.c_str(), path.c_str()) == 0;
}

}  // namespace shardsync
