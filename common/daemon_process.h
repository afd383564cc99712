// What both daemons' main files do around serving: stop on SIGINT/SIGTERM, and write
// the bound port for scripts and tests.
#pragma once

#include <string>

#include "common/flags.h"

namespace shardsync {

// The start of both daemons' main: --help prints `help` and the flags every daemon
// takes, and returns 0; --config FILE adds the file's settings (a bad file is a usage
// error, 2). Returns the exit code to stop with, or -1 to go on.
int HelpAndConfig(Flags& flags, const char* program, const char* help);
// Prints "program: error", the help, and returns 2 (a usage error).
int DaemonUsage(const char* program, const char* help, const std::string& error);

// Blocks SIGINT and SIGTERM in this thread and every thread started after it, so that
// WaitForStopSignal alone receives them. Call first in main.
void BlockStopSignals();
// Waits for SIGINT or SIGTERM; returns its number.
int WaitForStopSignal();
// Writes `port` to `path` through a rename, so a reader never sees half a file.
// Returns false when it could not.
bool WritePortFile(const std::string& path, int port);

}  // namespace shardsync
