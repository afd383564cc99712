// Host memory backend: POSIX shared memory objects opened by name (CPU mode).
#pragma once

#include "executor/memory.h"

namespace shardsync::executor {

class HostShmBackend final : public MemoryBackend {
 public:
  absl::string_view name() const override { return "host-shm"; }
  bool Accepts(const MemoryHandle& handle) const override { return !handle.shm_name.empty(); }
  absl::StatusOr<std::unique_ptr<MappedBuffer>> Open(const MemoryHandle& handle, int64_t bytes) override;
};

}  // namespace shardsync::executor
