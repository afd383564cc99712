// Host shared memory as an agent maps it: every page backed at registration (a full
// /dev/shm is a refusal then, not a SIGBUS later), and a shrunk object is noticed.
#include "executor/host_shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

namespace shardsync::executor {
namespace {

using Catch::Matchers::Contains;

struct Object {
  std::string name = "/shardsync-host-shm-test-" + std::to_string(getpid());
  explicit Object(off_t bytes) {
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, bytes) == 0);  // sparse: no page backed yet
    close(fd);
  }
  ~Object() { shm_unlink(name.c_str()); }
  struct stat Stat() const {
    struct stat info {};
    REQUIRE(stat(("/dev/shm" + name).c_str(), &info) == 0);
    return info;
  }
};

TEST_CASE("a registered stretch of host shared memory is backed by pages at once") {
  Object object(4 << 20);
  REQUIRE(object.Stat().st_blocks == 0);
  HostShmBackend backend;
  MemoryHandle handle;
  handle.shm_name = object.name;
  handle.offset_bytes = 1 << 20;
  auto mapped = backend.Open(handle, 2 << 20);
  REQUIRE(mapped.ok());
  CHECK(object.Stat().st_blocks * 512 >= (2 << 20));
  CHECK((*mapped)->CheckIntact().ok());
}

TEST_CASE("host shared memory shrunk under its registration is reported, naming it") {
  Object object(1 << 20);
  HostShmBackend backend;
  MemoryHandle handle;
  handle.shm_name = object.name;
  auto mapped = backend.Open(handle, 1 << 20);
  REQUIRE(mapped.ok());
  REQUIRE(truncate(("/dev/shm" + object.name).c_str(), 4096) == 0);
  const absl::Status intact = (*mapped)->CheckIntact();
  CHECK(intact.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(intact.message()), Contains(object.name) && Contains("shrunk to 4096 bytes"));
}

}  // namespace
}  // namespace shardsync::executor
