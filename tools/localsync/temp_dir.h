// Private folders for a test or a local run: under $TEST_TMPDIR when Bazel runs it (Bazel
// empties it after the test), else under the system's temporary folder ($TMPDIR or /tmp).
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace shardsync::localsync {

// The longest unix socket path: sockaddr_un's sun_path less its terminating NUL.
inline constexpr size_t kMaxSocketPath = 107;

// A new empty folder "<base>/<prefix>XXXXXX", base as above; the caller removes it.
// Throws std::runtime_error if it cannot be made.
std::string MakeTempDir(const std::string& prefix);

// A folder removed with all it holds when this goes (also when a constructor that holds
// it throws); `owned` false: someone else's, left as it is.
class ScopedDir {
 public:
  explicit ScopedDir(std::string path, bool owned = true) : path_(std::move(path)), owned_(owned) {}
  ~ScopedDir();
  ScopedDir(const ScopedDir&) = delete;
  ScopedDir& operator=(const ScopedDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool owned_;
};

// A folder for unix sockets named at most `longest_name` bytes: `dir` itself (not
// owned) when "<dir>/<longest_name>" fits kMaxSocketPath, else a new short folder under
// /tmp (owned). Throws std::runtime_error if it cannot be made.
ScopedDir SocketDirFor(const std::string& dir, size_t longest_name);

}  // namespace shardsync::localsync
