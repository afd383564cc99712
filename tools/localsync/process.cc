#include "tools/localsync/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <utility>

#include "absl/time/clock.h"

namespace shardsync::localsync {

Process::Process(const std::vector<std::string>& argv, const std::string& log_path) : log_path_(log_path) {
  int in[2], out[2];
  if (pipe(in) != 0 || pipe(out) != 0) std::abort();
  pid_ = fork();
  if (pid_ == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(log, 2);
    close(in[1]);
    close(out[0]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  stdin_fd_ = in[1];
  stdout_fd_ = out[0];
  signal(SIGPIPE, SIG_IGN);  // a client that left must not kill the test
}

Process::~Process() {
  if (!exited_) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(5));
  }
  close(stdin_fd_);
  close(stdout_fd_);
}

std::string Process::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const size_t newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) return "";
    pollfd fd{stdout_fd_, POLLIN, 0};
    if (poll(&fd, 1, static_cast<int>(left)) <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n <= 0) return "";
    buffered_.append(chunk, n);
  }
}

std::string Process::ReadAll(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    pollfd fd{stdout_fd_, POLLIN, 0};
    if (poll(&fd, 1, 50) <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n <= 0) break;
    buffered_.append(chunk, n);
  }
  return std::exchange(buffered_, "");
}

void Process::WriteLine(const std::string& line) {
  const std::string text = line + "\n";
  if (write(stdin_fd_, text.data(), text.size()) < 0) {
    // the process has gone; a later ReadLine or Wait reports it
  }
}

void Process::Signal(int signal) {
  if (!exited_) kill(pid_, signal);
}

bool Process::Stop(absl::Duration timeout) {
  if (exited_) return false;
  kill(pid_, SIGSTOP);
  for (const absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(2))) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG | WUNTRACED);
    if (done != pid_) continue;
    if (WIFSTOPPED(status)) return true;
    exited_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return false;
}

int Process::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!exited_) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      exited_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (absl::Now() > deadline) return -1;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return exit_code_;
}

int WaitForPortFile(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream file(path);
    int port = 0;
    if (file >> port && port > 0) return port;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return -1;
}

}  // namespace shardsync::localsync
