// Memory backends: how an agent maps a buffer a client registered. Implementations are
// chosen by the handle's kind (host shared memory here; CUDA IPC in the GPU backend).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace shardsync::executor {

// What a client hands over for one buffer.
struct MemoryHandle {
  std::string shm_name;         // POSIX shared memory object, host memory
  std::string cuda_ipc_handle;  // cudaIpcMemHandle_t bytes, device memory
  int fd = -1;                  // a descriptor of host memory (memfd, shared memory), borrowed for the call
  int64_t offset_bytes = 0;     // the buffer's start inside the mapped object
  int32_t device = -1;          // CUDA ordinal, -1 for host
  // Host memory: a shared memory object by name, or a descriptor of host memory.
  bool host_memory() const { return !shm_name.empty() || (fd >= 0 && device < 0); }
};

// Where a mapping's bytes live, comparable across one agent's mappings: two spans of
// one object that intersect are the same memory.
struct MemorySpan {
  std::string object;  // "shm <device>:<inode>" for host shared memory, else this process's address space
  uint64_t begin = 0;
  uint64_t end = 0;
  bool Overlaps(const MemorySpan& other) const {
    return object == other.object && begin < other.end && other.begin < end;
  }
};

// The `object` of a span of host shared memory.
inline std::string ShmObject(uint64_t device, uint64_t inode) { return absl::StrCat("shm ", device, ":", inode); }

// A buffer mapped into this process. Contract: the mapping stays valid for the object's
// lifetime; the registry owns it (shared with a running sync) and drops it when the
// client goes away. Nothing is freed in the client: only our mapping is closed.
class MappedBuffer {
 public:
  virtual ~MappedBuffer() = default;
  virtual uint8_t* data() const = 0;
  virtual int64_t bytes() const = 0;
  virtual bool on_device() const = 0;
  // The uid that owns the memory, where the backend can tell (host shared memory); none
  // for CUDA IPC, whose handle only the owning process can make.
  virtual std::optional<uint32_t> owner_uid() const { return std::nullopt; }
  // Its bytes' span: by default their addresses here (device pointers for CUDA memory).
  virtual MemorySpan span() const {
    const auto begin = reinterpret_cast<uintptr_t>(data());
    return {"address space", begin, begin + static_cast<uint64_t>(bytes())};
  }
  // A descriptor of the mapped object, valid as long as this buffer, that a same-node
  // peer may be handed (duplicated) to map the memory itself; -1 where there is none.
  virtual int descriptor() const { return -1; }
  // Whether the memory still holds what was mapped: a client can shrink host shared
  // memory under the mapping (touching the lost pages, SigbusGuard detaches the mapping
  // instead of letting the process die). Checked before and after every sync; OK for
  // memory no client can shrink.
  virtual absl::Status CheckIntact() const { return absl::OkStatus(); }
};

class MemoryBackend {
 public:
  virtual ~MemoryBackend() = default;
  virtual absl::string_view name() const = 0;
  virtual bool Accepts(const MemoryHandle& handle) const = 0;
  // Maps the buffer and checks that the object really holds offset + bytes.
  virtual absl::StatusOr<std::unique_ptr<MappedBuffer>> Open(const MemoryHandle& handle, int64_t bytes) = 0;
  // The same for a peer agent's target (the direct path), which may lie on another
  // device of this host that this one reaches by peer access.
  virtual absl::StatusOr<std::unique_ptr<MappedBuffer>> OpenPeer(const MemoryHandle& handle, int64_t bytes) {
    return Open(handle, bytes);
  }
  // Memory this agent owns, which peers of its host map by `handle` (a scratch buffer):
  // `bytes` of this backend's memory, freed when `buffer` is destroyed.
  struct Owned {
    std::unique_ptr<MappedBuffer> buffer;
    MemoryHandle handle;
  };
  virtual absl::StatusOr<Owned> Allocate(int64_t bytes) {
    return absl::UnimplementedError(
        absl::StrCat("the ", name(), " memory backend allocates no memory of its own (", bytes, " bytes asked)"));
  }
};

}  // namespace shardsync::executor
