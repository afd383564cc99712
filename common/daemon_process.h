// What both daemons' main files share: the flags every daemon takes, stopping on
// SIGINT/SIGTERM, and the bound port written for scripts and tests.
#pragma once

#include <string>

#include "common/flags.h"
#include "common/tls.h"

namespace shardsync {

// The flags every daemon takes beside its own.
struct DaemonFlags {
  std::string log_level = "info";
  std::string metrics_listen;     // HOST:PORT of /metrics; empty: not served
  std::string metrics_port_file;  // where the bound metrics port is written
  TlsConfig tls;
  Keepalive keepalive;
};
// Adds them, with --config FILE (common/flags.h).
void AddDaemonFlags(CLI::App& app, DaemonFlags& flags);

// Blocks SIGINT and SIGTERM in this thread and every thread started after it, so that
// WaitForStopSignal alone receives them. Call first in main.
void BlockStopSignals();
// In a release build (NDEBUG) turns off abseil's lock-order graph, which a libabsl
// built without NDEBUG (Debian's) keeps on every Mutex of the process, gRPC's too;
// debug builds and the tests keep it, and abort on a lock-order cycle.
void SkipLockOrderChecksInRelease();
// Waits for SIGINT or SIGTERM; returns its number.
int WaitForStopSignal();
// Writes `port` to `path` through a rename, so a reader never sees half a file.
// Returns false when it could not, or when `path` is something else than a regular file
// (the rename would replace it).
bool WritePortFile(const std::string& path, int port);

}  // namespace shardsync
