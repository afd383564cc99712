// Child processes of a test or a local run: started with their stdin and stdout piped
// to the caller and stderr appended to a log file; killed (SIGKILL) when dropped.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace shardsync::localsync {

// A child process with its stdin and stdout piped to us and stderr in a log file.
class Process {
 public:
  // argv[0] is the program's path (no PATH search).
  Process(const std::vector<std::string>& argv, const std::string& log_path);
  ~Process();  // SIGKILL if still running
  // The next stdout line, or "" at the deadline or end of output.
  std::string ReadLine(absl::Duration timeout);
  // Everything on stdout until the process closes it (or the deadline).
  std::string ReadAll(absl::Duration timeout);
  void WriteLine(const std::string& line);
  void Signal(int signal);
  // SIGSTOP, then waits until the process has stopped (a signal lands when the process
  // is next scheduled, not when kill returns); false if it did not by `timeout`.
  bool Stop(absl::Duration timeout);
  // Waits for the exit; returns the exit code (128 + signal if killed), -1 on timeout.
  int Wait(absl::Duration timeout);
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

 private:
  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::string buffered_;
  std::string log_path_;
  bool exited_ = false;
  int exit_code_ = -1;
};

// Reads an integer written to `path` by a daemon (a port), waiting up to `timeout`;
// -1 if none by then.
int WaitForPortFile(const std::string& path, absl::Duration timeout);

}  // namespace shardsync::localsync
