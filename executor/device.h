// Where one rank's buffers live and how bytes are copied there: host memory, or one
// CUDA device (copy kernels on the agent's stream). The round engine talks to this, so
// it is the same for every memory and transport.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "executor/word_hash.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace shardsync::executor {

// This rank's buffers by the plan's Holder::buffer id; nullptr for ids it does not hold.
using BufferTable = std::vector<uint8_t*>;

class Device {
 public:
  virtual ~Device() = default;
  virtual absl::string_view name() const = 0;
  // Staging for one peer and direction: allocated once at `bytes` and reused.
  virtual absl::StatusOr<uint8_t*> Staging(int32_t peer, bool send, int64_t bytes) = 0;
  // Frees one staging buffer (after everything queued that uses it).
  virtual absl::Status ReleaseStaging(int32_t peer, bool send) = 0;
  // Copies the parts' source elements, in order and converted to the target dtype,
  // back to back into `out`. May only queue the work: see Synchronize.
  virtual absl::Status Pack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                            const BufferTable& buffers, uint8_t* out) = 0;
  // The reverse: packed target-dtype bytes from `in` into the parts' targets.
  virtual absl::Status Unpack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                              const uint8_t* in, const BufferTable& buffers) = 0;
  // Local copies and zero fills; on a device they run beside the network rounds.
  virtual absl::Status CopyLocal(const planner::Plan& plan, absl::Span<const int32_t> segments,
                                 absl::Span<const int32_t> fills, const BufferTable& buffers) = 0;
  // Waits for everything queued so far.
  virtual absl::Status Synchronize() = 0;
  // Waits for everything queued, then hashes `pieces` of `data` (staging) where the data
  // lives: sums[i] = the sum of WordHash over piece i (executor/word_hash.h).
  virtual absl::Status HashPieces(const uint8_t* data, absl::Span<const HashPiece> pieces, uint64_t* sums) = 0;
  // How long the last CopyLocal's copies and fills ran (after Synchronize): beside the
  // rounds on a device, so the part of a sync they explain.
  virtual absl::StatusOr<double> LastLocalSeconds() = 0;
};

// Host memory: every call copies at once.
class HostDevice final : public Device {
 public:
  absl::string_view name() const override { return "host"; }
  absl::StatusOr<uint8_t*> Staging(int32_t peer, bool send, int64_t bytes) override;
  absl::Status ReleaseStaging(int32_t peer, bool send) override {
    staging_.erase({peer, send});
    return absl::OkStatus();
  }
  absl::Status Pack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                    const BufferTable& buffers, uint8_t* out) override;
  absl::Status Unpack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const uint8_t* in,
                      const BufferTable& buffers) override;
  absl::Status CopyLocal(const planner::Plan& plan, absl::Span<const int32_t> segments,
                         absl::Span<const int32_t> fills, const BufferTable& buffers) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status HashPieces(const uint8_t* data, absl::Span<const HashPiece> pieces, uint64_t* sums) override;
  absl::StatusOr<double> LastLocalSeconds() override { return local_seconds_; }

 private:
  std::map<std::pair<int32_t, bool>, std::vector<uint8_t>> staging_;
  double local_seconds_ = 0;
};

}  // namespace shardsync::executor
