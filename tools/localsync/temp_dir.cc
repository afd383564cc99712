#include "tools/localsync/temp_dir.h"

#include <stdlib.h>
#include <sys/un.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace shardsync::localsync {
namespace {

static_assert(kMaxSocketPath == sizeof(sockaddr_un::sun_path) - 1);

std::string MakeDirFromTemplate(std::string pattern) {
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot make a temporary folder " + pattern);
  return pattern;
}

}  // namespace

std::string MakeTempDir(const std::string& prefix) {
  const char* test_tmpdir = std::getenv("TEST_TMPDIR");
  const std::string base = test_tmpdir != nullptr && *test_tmpdir != '\0'
                               ? std::string(test_tmpdir)
                               : std::filesystem::temp_directory_path().string();
  return MakeDirFromTemplate(base + "/" + prefix + "XXXXXX");
}

std::string SocketDirFor(const std::string& dir, size_t longest_name) {
  if (dir.size() + 1 + longest_name <= kMaxSocketPath) return dir;
  // Under /tmp, not TEST_TMPDIR: only a short folder keeps a socket path within sun_path.
  return MakeDirFromTemplate("/tmp/ss-XXXXXX");
}

}  // namespace shardsync::localsync
