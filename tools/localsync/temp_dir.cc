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

ScopedDir SocketDirFor(const std::string& dir, size_t longest_name) {
  if (dir.size() + 1 + longest_name <= kMaxSocketPath) return ScopedDir(dir, /*owned=*/false);
  // Under /tmp, not TEST_TMPDIR: only a short folder keeps a socket path within sun_path.
  return ScopedDir(MakeDirFromTemplate("/tmp/ss-XXXXXX"));
}

ScopedDir::~ScopedDir() {
  std::error_code ignored;  // a folder already gone is fine
  if (owned_) std::filesystem::remove_all(path_, ignored);
}

}  // namespace shardsync::localsync
