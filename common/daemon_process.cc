#include "common/daemon_process.h"

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <fstream>

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

void WritePortFile(const std::string& path, int port) {
  const std::string temporary = path + ".tmp";
  std::ofstream(temporary) << port << "\n";
  std::rename(temporary.c_str(), path.c_str());
}

}  // namespace shardsync
