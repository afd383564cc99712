// Host shared memory as an agent maps it: every page backed at registration (a full
// /dev/shm is a refusal then, not a SIGBUS later), and a shrunk object is noticed.
#include "executor/host_shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

TEST_CASE("owned scratch: shared by name, 0600, unlinked by its owner; a gone owner's is removed at start") {
  HostShmBackend backend;
  auto owned = backend.Allocate(8192);
  REQUIRE(owned.ok());
  const std::string name = owned->handle.shm_name;
  struct stat info {};
  REQUIRE(stat(("/dev/shm" + name).c_str(), &info) == 0);
  CHECK((info.st_mode & 0777) == 0600);
  CHECK(info.st_blocks * 512 >= 8192);  // backed at once
  auto peer = backend.Open(owned->handle, 8192);
  REQUIRE(peer.ok());
  owned->buffer->data()[8191] = 7;
  CHECK((*peer)->data()[8191] == 7);
  CHECK(HostShmBackend::RemoveOrphanScratch() == 0);  // held by this process: it stays
  CHECK(stat(("/dev/shm" + name).c_str(), &info) == 0);
  owned->buffer.reset();
  CHECK(stat(("/dev/shm" + name).c_str(), &info) != 0);

  // A scratch left by a process that is gone (a SIGKILLed agent cannot unlink it).
  int pipe_ends[2];
  REQUIRE(pipe(pipe_ends) == 0);
  const pid_t child = fork();
  if (child == 0) {
    auto left = HostShmBackend().Allocate(4096);
    const std::string left_name = left.ok() ? left->handle.shm_name : "";
    (void)!write(pipe_ends[1], left_name.c_str(), left_name.size() + 1);
    _exit(left.ok() ? 0 : 1);  // without the destructor: the object stays
  }
  REQUIRE(child > 0);
  char left_name[256] = {};
  REQUIRE(read(pipe_ends[0], left_name, sizeof(left_name) - 1) > 0);
  int exit_status = -1;
  waitpid(child, &exit_status, 0);
  REQUIRE(exit_status == 0);
  REQUIRE(stat((std::string("/dev/shm") + left_name).c_str(), &info) == 0);
  CHECK(HostShmBackend::RemoveOrphanScratch() >= 1);
  CHECK(stat((std::string("/dev/shm") + left_name).c_str(), &info) != 0);
  close(pipe_ends[0]);
  close(pipe_ends[1]);
}

}  // namespace
}  // namespace shardsync::executor
