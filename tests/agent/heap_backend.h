// Test memory for an agent's registry: every handle with an shm name opens as fresh
// host memory of exactly the registered size (so a sanitizer sees any write past it).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "executor/memory.h"

namespace shardsync::agent {

class HeapBuffer final : public executor::MappedBuffer {
 public:
  explicit HeapBuffer(int64_t bytes) : bytes_(bytes) {}
  uint8_t* data() const override { return const_cast<uint8_t*>(bytes_.data()); }
  int64_t bytes() const override { return static_cast<int64_t>(bytes_.size()); }
  bool on_device() const override { return false; }
  std::optional<uint32_t> owner_uid() const override { return std::nullopt; }

 private:
  std::vector<uint8_t> bytes_;
};

class HeapBackend final : public executor::MemoryBackend {
 public:
  // Refuses sizes above `max_bytes`, as a real backend refuses sizes past its allocation.
  explicit HeapBackend(int64_t max_bytes = int64_t{1} << 30) : max_bytes_(max_bytes) {}
  absl::string_view name() const override { return "heap"; }
  bool Accepts(const executor::MemoryHandle& handle) const override { return !handle.shm_name.empty(); }
  absl::StatusOr<std::unique_ptr<executor::MappedBuffer>> Open(const executor::MemoryHandle&, int64_t bytes) override {
    if (bytes < 0 || bytes > max_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(bytes, " bytes is outside [0, ", max_bytes_, "]"));
    }
    return std::unique_ptr<executor::MappedBuffer>(new HeapBuffer(bytes));
  }

 private:
  int64_t max_bytes_;
};

}  // namespace shardsync::agent
