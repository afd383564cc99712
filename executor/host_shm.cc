#include "executor/host_shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "executor/sigbus_guard.h"

namespace shardsync::executor {
namespace {

class HostShmBuffer final : public MappedBuffer {
 public:
  // Owns `fd` (kept to check the object's size), the mapping and its watch.
  // `what` names the memory in errors.
  HostShmBuffer(std::string what, int fd, void* mapping, size_t mapped, int watch, uint8_t* data, int64_t bytes,
                uint32_t owner, MemorySpan span)
      : what_(std::move(what)),
        fd_(fd),
        mapping_(mapping),
        mapped_(mapped),
        watch_(watch),
        data_(data),
        bytes_(bytes),
        owner_(owner),
        span_(std::move(span)) {}
  ~HostShmBuffer() override {
    SigbusGuard::Unwatch(watch_);
    munmap(mapping_, mapped_);
    close(fd_);
  }
  uint8_t* data() const override { return data_; }
  int64_t bytes() const override { return bytes_; }
  bool on_device() const override { return false; }
  std::optional<uint32_t> owner_uid() const override { return owner_; }
  MemorySpan span() const override { return span_; }
  int descriptor() const override { return fd_; }
  absl::Status CheckIntact() const override {
    if (SigbusGuard::Faulted(watch_)) {
      return absl::FailedPreconditionError(
          absl::StrCat(what_, " was shrunk while in use; this mapping no longer shows it: register it again"));
    }
    struct stat info {};
    if (fstat(fd_, &info) != 0) return absl::InternalError(absl::StrCat(what_, ": fstat: ", std::strerror(errno)));
    if (info.st_size < static_cast<off_t>(mapped_)) {
      return absl::FailedPreconditionError(
          absl::StrCat(what_, " was shrunk to ", info.st_size, " bytes under its registration of ", mapped_));
    }
    return absl::OkStatus();
  }

 private:
  std::string what_;
  int fd_;
  void* mapping_;
  size_t mapped_;
  int watch_;
  uint8_t* data_;
  int64_t bytes_;
  uint32_t owner_;
  MemorySpan span_;
};

constexpr char kScratchPrefix[] = "shardsync-scratch-";

// Host memory this process made (HostShmBackend::Allocate): unlinked, then unmapped,
// when destroyed; its lock goes with the descriptor.
class OwnedShmBuffer final : public MappedBuffer {
 public:
  OwnedShmBuffer(std::string name, int fd, void* mapping, int watch, int64_t bytes, MemorySpan span)
      : name_(std::move(name)), fd_(fd), mapping_(mapping), watch_(watch), bytes_(bytes), span_(std::move(span)) {}
  ~OwnedShmBuffer() override {
    shm_unlink(name_.c_str());
    SigbusGuard::Unwatch(watch_);
    munmap(mapping_, static_cast<size_t>(std::max<int64_t>(bytes_, 1)));
    close(fd_);
  }
  uint8_t* data() const override { return static_cast<uint8_t*>(mapping_); }
  int64_t bytes() const override { return bytes_; }
  bool on_device() const override { return false; }
  std::optional<uint32_t> owner_uid() const override { return geteuid(); }
  MemorySpan span() const override { return span_; }
  absl::Status CheckIntact() const override {
    if (!SigbusGuard::Faulted(watch_)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("scratch '", name_, "' was shrunk while in use"));
  }

 private:
  std::string name_;
  int fd_;
  void* mapping_;
  int watch_;
  int64_t bytes_;
  MemorySpan span_;
};

}  // namespace

absl::StatusOr<MemoryBackend::Owned> HostShmBackend::Allocate(int64_t bytes) {
  // Another agent's orphan sweep may unlink a new object before its lock is taken:
  // then a new name is tried.
  absl::StatusOr<Owned> owned = absl::UnknownError("not tried");
  for (int attempt = 0; attempt < 3; ++attempt) {
    owned = AllocateOnce(bytes);
    if (!absl::IsAborted(owned.status())) return owned;
  }
  return owned;
}

absl::StatusOr<MemoryBackend::Owned> HostShmBackend::AllocateOnce(int64_t bytes) {
  static std::atomic<int64_t> made{0};
  const std::string name =
      absl::StrCat("/", kScratchPrefix, getpid(), "-", absl::ToUnixNanos(absl::Now()), "-", made++);
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("shm_open('", name, "'): ", std::strerror(errno)));
  const size_t mapped = static_cast<size_t>(std::max<int64_t>(bytes, 1));
  int error = flock(fd, LOCK_EX) == 0 ? posix_fallocate(fd, 0, static_cast<off_t>(mapped)) : errno;
  // Another agent's orphan sweep may have unlinked it before the lock was taken.
  struct stat own {
  }, linked{};
  if (error == 0 && (fstat(fd, &own) != 0 || stat(absl::StrCat("/dev/shm", name).c_str(), &linked) != 0 ||
                     own.st_ino != linked.st_ino)) {
    close(fd);
    return absl::AbortedError(absl::StrCat("shm '", name, "' was removed as it was made"));
  }
  void* mapping = MAP_FAILED;
  if (error == 0) {
    mapping = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapping == MAP_FAILED) error = errno;
  }
  absl::StatusOr<int> watch = absl::UnknownError("not mapped");
  if (error == 0) {
    watch = SigbusGuard::Watch(mapping, mapped);
    if (!watch.ok()) {
      munmap(mapping, mapped);
      error = ENOMEM;
    }
  }
  if (error != 0) {
    shm_unlink(name.c_str());
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("shm '", name, "': cannot back ", bytes, " bytes of scratch: ", std::strerror(error)));
  }
  Owned owned;
  owned.buffer = std::make_unique<OwnedShmBuffer>(
      name, fd, mapping, *watch, bytes, MemorySpan{ShmObject(own.st_dev, own.st_ino), 0, static_cast<uint64_t>(bytes)});
  owned.handle.shm_name = name;
  return owned;
}

int HostShmBackend::RemoveOrphanScratch() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (const dirent* entry = readdir(dir)) {
    if (!absl::StartsWith(entry->d_name, kScratchPrefix)) continue;
    const std::string name = absl::StrCat("/", entry->d_name);
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && shm_unlink(name.c_str()) == 0) ++removed;
    close(fd);  // releases the lock
  }
  closedir(dir);
  return removed;
}

absl::StatusOr<std::unique_ptr<MappedBuffer>> HostShmBackend::Open(const MemoryHandle& handle, int64_t bytes) {
  // Named in errors as the client gave it.
  const std::string what =
      handle.shm_name.empty() ? "host memory passed as a descriptor" : absl::StrCat("shm '", handle.shm_name, "'");
  if (bytes < 0 || handle.offset_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": negative size or offset"));
  }
  // Our own descriptor either way: the caller's stays theirs.
  const int fd = handle.shm_name.empty() ? fcntl(handle.fd, F_DUPFD_CLOEXEC, 0)
                                         : shm_open(handle.shm_name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot open: ", std::strerror(errno)));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return absl::InternalError(absl::StrCat(what, ": fstat: ", std::strerror(error)));
  }
  const int64_t need = handle.offset_bytes + bytes;
  if (need > info.st_size || need < bytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(what, " holds ", info.st_size, " bytes; the registration claims ",
                                                   bytes, " at offset ", handle.offset_bytes));
  }
  // Every page of the range backed now: a full /dev/shm is a refusal here, never a
  // SIGBUS in a later sync. Allocating keeps the contents.
  if (bytes > 0) {
    if (const int error = posix_fallocate(fd, handle.offset_bytes, bytes); error != 0) {
      close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat(what, ": cannot back ", bytes, " bytes: ", std::strerror(error)));
    }
  }
  const size_t mapped = static_cast<size_t>(std::max<int64_t>(need, 1));
  void* mapping = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  if (mapping == MAP_FAILED) {
    close(fd);
    return absl::InternalError(absl::StrCat(what, ": mmap: ", std::strerror(error)));
  }
  const absl::StatusOr<int> watch = SigbusGuard::Watch(mapping, mapped);
  if (!watch.ok()) {
    munmap(mapping, mapped);
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(what, ": ", watch.status().message()));
  }
  const MemorySpan span{ShmObject(info.st_dev, info.st_ino), static_cast<uint64_t>(handle.offset_bytes),
                        static_cast<uint64_t>(need)};
  return std::unique_ptr<MappedBuffer>(new HostShmBuffer(what, fd, mapping, mapped, *watch,
                                                         static_cast<uint8_t*>(mapping) + handle.offset_bytes, bytes,
                                                         info.st_uid, span));
}

}  // namespace shardsync::executor
