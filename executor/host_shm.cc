#include "executor/host_shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardsync::executor {
namespace {

class HostShmBuffer final : public MappedBuffer {
 public:
  // Owns `fd` (kept to check the object's size) and the mapping.
  HostShmBuffer(std::string name, int fd, void* mapping, size_t mapped, uint8_t* data, int64_t bytes, uint32_t owner)
      : name_(std::move(name)),
        fd_(fd),
        mapping_(mapping),
        mapped_(mapped),
        data_(data),
        bytes_(bytes),
        owner_(owner) {}
  ~HostShmBuffer() override {
    munmap(mapping_, mapped_);
    close(fd_);
  }
  uint8_t* data() const override { return data_; }
  int64_t bytes() const override { return bytes_; }
  bool on_device() const override { return false; }
  std::optional<uint32_t> owner_uid() const override { return owner_; }
  absl::Status CheckIntact() const override {
    struct stat info {};
    if (fstat(fd_, &info) != 0)
      return absl::InternalError(absl::StrCat("fstat('", name_, "'): ", std::strerror(errno)));
    if (info.st_size < static_cast<off_t>(mapped_)) {
      return absl::FailedPreconditionError(
          absl::StrCat("shm '", name_, "' was shrunk to ", info.st_size, " bytes under its registration of ", mapped_));
    }
    return absl::OkStatus();
  }

 private:
  std::string name_;
  int fd_;
  void* mapping_;
  size_t mapped_;
  uint8_t* data_;
  int64_t bytes_;
  uint32_t owner_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MappedBuffer>> HostShmBackend::Open(const MemoryHandle& handle, int64_t bytes) {
  if (bytes < 0 || handle.offset_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("shm '", handle.shm_name, "': negative size or offset"));
  }
  const int fd = shm_open(handle.shm_name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("shm_open('", handle.shm_name, "'): ", std::strerror(errno)));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("fstat('", handle.shm_name, "'): ", std::strerror(error)));
  }
  const int64_t need = handle.offset_bytes + bytes;
  if (need > info.st_size || need < bytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shm '", handle.shm_name, "' holds ", info.st_size,
                                                   " bytes; the registration claims ", bytes, " at offset ",
                                                   handle.offset_bytes));
  }
  // Every page of the range backed now: a full /dev/shm is a refusal here, never a
  // SIGBUS in a later sync. Allocating keeps the contents.
  if (bytes > 0) {
    if (const int error = posix_fallocate(fd, handle.offset_bytes, bytes); error != 0) {
      close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat("shm '", handle.shm_name, "': cannot back ", bytes, " bytes: ", std::strerror(error)));
    }
  }
  const size_t mapped = static_cast<size_t>(std::max<int64_t>(need, 1));
  void* mapping = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  if (mapping == MAP_FAILED) {
    close(fd);
    return absl::InternalError(absl::StrCat("mmap('", handle.shm_name, "'): ", std::strerror(error)));
  }
  return std::unique_ptr<MappedBuffer>(new HostShmBuffer(
      handle.shm_name, fd, mapping, mapped, static_cast<uint8_t*>(mapping) + handle.offset_bytes, bytes, info.st_uid));
}

}  // namespace shardsync::executor
