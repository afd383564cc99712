// What both daemons' main files do around serving: stop on SIGINT/SIGTERM, and write
// the bound port for scripts and tests.
#pragma once

#include <string>

namespace shardsync {

// Blocks SIGINT and SIGTERM in this thread and every thread started after it, so that
// WaitForStopSignal alone receives them. Call first in main.
void BlockStopSignals();
// Waits for SIGINT or SIGTERM; returns its number.
int WaitForStopSignal();
// Writes `port` to `path` through a rename, so a reader never sees half a file.
// Returns false when it could not.
bool WritePortFile(const std::string& path, int port);

}  // namespace shardsync
