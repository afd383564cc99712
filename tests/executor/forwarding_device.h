// Test helper: a Device that passes every call to another. A test derives from it and
// overrides the calls it watches or delays.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "executor/device.h"

namespace shardsync::testing {

class ForwardingDevice : public executor::Device {
 public:
  explicit ForwardingDevice(executor::Device& inner) : inner_(inner) {}
  absl::string_view name() const override { return inner_.name(); }
  absl::StatusOr<uint8_t*> Staging(int32_t peer, bool send, int slot, int64_t bytes) override {
    return inner_.Staging(peer, send, slot, bytes);
  }
  absl::Status ReleaseStaging(int32_t peer, bool send) override { return inner_.ReleaseStaging(peer, send); }
  absl::Status Pack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                    const executor::BufferTable& buffers, uint8_t* out, int slot) override {
    return inner_.Pack(plan, parts, buffers, out, slot);
  }
  absl::Status Unpack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const uint8_t* in,
                      const executor::BufferTable& buffers, int slot) override {
    return inner_.Unpack(plan, parts, in, buffers, slot);
  }
  absl::Status Gather(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                      const executor::BufferTable& buffers, uint8_t* out, int slot) override {
    return inner_.Gather(plan, parts, buffers, out, slot);
  }
  absl::Status BeforeTransfer(int slot) override { return inner_.BeforeTransfer(slot); }
  absl::Status AfterTransfer(int slot) override { return inner_.AfterTransfer(slot); }
  absl::Status CopyLocal(const planner::Plan& plan, absl::Span<const int32_t> segments, absl::Span<const int32_t> fills,
                         const executor::BufferTable& buffers) override {
    return inner_.CopyLocal(plan, segments, fills, buffers);
  }
  absl::Status CopyDirect(const planner::Plan& plan, absl::Span<const int32_t> segments,
                          const executor::BufferTable& buffers) override {
    return inner_.CopyDirect(plan, segments, buffers);
  }
  absl::Status FinishDirect() override { return inner_.FinishDirect(); }
  absl::Status Quantize(const planner::Plan& plan, absl::Span<const int32_t> quantizes,
                        const executor::BufferTable& buffers) override {
    return inner_.Quantize(plan, quantizes, buffers);
  }
  absl::Status Fence() override { return inner_.Fence(); }
  absl::Status Synchronize() override { return inner_.Synchronize(); }
  absl::Status QueueHashes(absl::Span<const executor::HashPiece> pieces) override { return inner_.QueueHashes(pieces); }
  absl::StatusOr<std::vector<uint64_t>> CollectHashes() override { return inner_.CollectHashes(); }
  absl::StatusOr<double> TakeLocalSeconds() override { return inner_.TakeLocalSeconds(); }
  absl::StatusOr<std::shared_ptr<const executor::ReadyEvent>> OpenReadyEvent(const std::string& handle) override {
    return inner_.OpenReadyEvent(handle);
  }
  absl::Status WaitFor(absl::Span<const std::shared_ptr<const executor::ReadyEvent>> events) override {
    return inner_.WaitFor(events);
  }

 private:
  executor::Device& inner_;
};

}  // namespace shardsync::testing
