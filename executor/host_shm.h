// Host memory backend (CPU mode): POSIX shared memory objects opened by name, and host
// memory a client passed as a descriptor (a memfd, a shared memory object).
#pragma once

#include "executor/memory.h"

namespace shardsync::executor {

class HostShmBackend final : public MemoryBackend {
 public:
  absl::string_view name() const override { return "host-shm"; }
  bool Accepts(const MemoryHandle& handle) const override { return handle.host_memory(); }
  absl::StatusOr<std::unique_ptr<MappedBuffer>> Open(const MemoryHandle& handle, int64_t bytes) override;
  // A new object, /shardsync-scratch-..., mode 0600, every page backed, locked (flock)
  // while this process holds it and unlinked when the buffer is destroyed.
  absl::StatusOr<Owned> Allocate(int64_t bytes) override;
  // Unlinks the scratch objects whose owners are gone (nobody holds their lock);
  // returns how many.
  static int RemoveOrphanScratch();

 private:
  // One try; ABORTED when the object was unlinked before its lock was taken.
  absl::StatusOr<Owned> AllocateOnce(int64_t bytes);
};

}  // namespace shardsync::executor
