// Host shared memory as an agent maps it: every page backed at registration (a full
// /dev/shm is a refusal then, not a SIGBUS later), a shrunk object is noticed, and one
// shrunk while in use costs the mapping, not the process.
#include "executor/host_shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "executor/sigbus_guard.h"
#include "tests/common/unique_name.h"

namespace shardsync::executor {
namespace {

using Catch::Matchers::Contains;

struct Object {
  std::string name = testing::UniqueName("/shardsync-host-shm-test-");
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

TEST_CASE("memory shrunk while in use: reads give zeros, writes go nowhere, the process lives and names it") {
  Object object(1 << 20);
  HostShmBackend backend;
  MemoryHandle handle;
  handle.shm_name = object.name;
  handle.offset_bytes = 4096;
  auto mapped = backend.Open(handle, (1 << 20) - 4096);
  REQUIRE(mapped.ok());
  std::memset((*mapped)->data(), 0x5a, (*mapped)->bytes());
  REQUIRE(truncate(("/dev/shm" + object.name).c_str(), 0) == 0);
  volatile uint8_t* data = (*mapped)->data();
  const uint8_t read_back = data[12345];  // a lost page: SIGBUS without the guard
  data[777] = 1;
  std::vector<uint8_t> copy((*mapped)->bytes());
  std::memcpy(copy.data(), (*mapped)->data(), copy.size());
  CHECK(read_back == 0);
  CHECK(copy[777] == 1);  // the process's own zero pages now
  const absl::Status intact = (*mapped)->CheckIntact();
  CHECK(intact.code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(intact.message()), Contains(object.name) && Contains("shrunk while in use"));
  // Growing the object back does not bring the mapping back: it stays refused.
  REQUIRE(truncate(("/dev/shm" + object.name).c_str(), 1 << 20) == 0);
  CHECK_FALSE((*mapped)->CheckIntact().ok());
  // A second mapping of the object, made after, is whole again.
  auto again = backend.Open(handle, 4096);
  REQUIRE(again.ok());
  CHECK((*again)->CheckIntact().ok());
}

TEST_CASE("a SIGBUS outside every watched range still ends the process") {
  Object watched(1 << 16);
  HostShmBackend backend;
  MemoryHandle handle;
  handle.shm_name = watched.name;
  REQUIRE(backend.Open(handle, 1 << 16).ok());  // the handler is installed
  const pid_t child = fork();
  if (child == 0) {
    const std::string name = watched.name + "-unwatched";
    const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || ftruncate(fd, 8192) != 0) _exit(3);
    auto* page = static_cast<volatile uint8_t*>(mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    shm_unlink(name.c_str());
    if (ftruncate(fd, 0) != 0) _exit(4);
    page[100] = 1;  // not ours: dies here
    _exit(0);
  }
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGBUS);
}

TEST_CASE("the watch table refuses past its capacity, and a slot is reused once freed") {
  static uint8_t page[4096] __attribute__((aligned(4096)));
  std::vector<int> slots;
  absl::StatusOr<int> slot = SigbusGuard::Watch(page, sizeof(page));
  while (slot.ok()) {
    slots.push_back(*slot);
    slot = SigbusGuard::Watch(page, sizeof(page));
  }
  CHECK(slot.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK(slots.size() <= static_cast<size_t>(SigbusGuard::kCapacity));
  CHECK(slots.size() >= static_cast<size_t>(SigbusGuard::kCapacity) - 16);
  SigbusGuard::Unwatch(slots.back());
  const absl::StatusOr<int> reused = SigbusGuard::Watch(page, sizeof(page));
  REQUIRE(reused.ok());
  CHECK(*reused == slots.back());
  slots.back() = *reused;
  for (int k : slots) SigbusGuard::Unwatch(k);
}

}  // namespace
}  // namespace shardsync::executor
