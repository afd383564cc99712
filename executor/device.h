// Where one rank's buffers live and how bytes are copied there: host memory, or one
// CUDA device (copy kernels on their own streams). The round engine talks to this, so
// it is the same for every memory and transport.
//
// Staging is double buffered: round k uses slot k % 2 of each peer's staging, so a
// device may pack round k+1 and unpack round k-1 while round k is on the link. The
// engine brackets each round's transfer with BeforeTransfer/AfterTransfer(slot); a
// device orders the work of one slot (pack -> transfer -> unpack -> the next pack or
// transfer into that slot) and nothing else.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "executor/word_hash.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace shardsync::executor {

// This rank's buffers by the plan's Holder::buffer id; nullptr for ids it does not hold.
using BufferTable = std::vector<uint8_t*>;

// A client's interprocess event, opened by the device that waits for it.
class ReadyEvent {
 public:
  virtual ~ReadyEvent() = default;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual absl::string_view name() const = 0;
  // Staging slot `slot` (0 or 1) for one peer and direction: allocated once at `bytes`
  // and reused.
  virtual absl::StatusOr<uint8_t*> Staging(int32_t peer, bool send, int slot, int64_t bytes) = 0;
  // Frees both slots of one peer and direction (after everything queued that uses them).
  virtual absl::Status ReleaseStaging(int32_t peer, bool send) = 0;
  // Copies the parts' source elements, in order and converted to the target dtype,
  // back to back into `out` (staging of `slot`), after the transfer that last read that
  // slot. May only queue the work: see Synchronize.
  virtual absl::Status Pack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                            const BufferTable& buffers, uint8_t* out, int slot) = 0;
  // The reverse: packed target-dtype bytes from `in` (staging of `slot`) into the parts'
  // targets, after the transfer that filled it.
  virtual absl::Status Unpack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const uint8_t* in,
                              const BufferTable& buffers, int slot) = 0;
  // The parts' target elements as they are now, packed as Unpack reads them, into `out`
  // (staging of `slot`): the receiver's baseline of a delta. Host memory only; other
  // devices refuse (UNIMPLEMENTED) and take no deltas.
  virtual absl::Status Gather(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                              const BufferTable& buffers, uint8_t* out, int slot) {
    (void)plan, (void)parts, (void)buffers, (void)out, (void)slot;
    return absl::UnimplementedError(absl::StrCat("the ", name(), " device takes no deltas"));
  }
  // Around the transport's round on `slot`: the transfer starts after this slot's packs
  // and after the unpacks of the round that last received into it.
  virtual absl::Status BeforeTransfer(int slot) = 0;
  virtual absl::Status AfterTransfer(int slot) = 0;
  // Local copies and zero fills; on a device they run beside the network rounds.
  virtual absl::Status CopyLocal(const planner::Plan& plan, absl::Span<const int32_t> segments,
                                 absl::Span<const int32_t> fills, const BufferTable& buffers) = 0;
  // The direct path: copies `segments` whose targets lie in peers' memory mapped into
  // this process (their entries in `buffers`), beside the other work, after what the
  // last Fence ordered. FinishDirect waits for every one queued: then their bytes are
  // in the peers' memory, and a peer may be told so.
  virtual absl::Status CopyDirect(const planner::Plan& plan, absl::Span<const int32_t> segments,
                                  const BufferTable& buffers) = 0;
  virtual absl::Status FinishDirect() = 0;
  // Quantizes `quantizes` (indices into plan.quantizes) from their scratch into their
  // targets and scales (planner/quantize.h), after everything queued so far on every
  // stream; work queued after the next Fence waits for it.
  virtual absl::Status Quantize(const planner::Plan& plan, absl::Span<const int32_t> quantizes,
                                const BufferTable& buffers) = 0;
  // Everything queued after this waits for everything queued before it, on every
  // stream: the next stage of a sync reads targets this one wrote.
  virtual absl::Status Fence() = 0;
  // Waits for everything queued so far.
  virtual absl::Status Synchronize() = 0;
  // Queues the hashing of `pieces` (of staging or of registered buffers) where the data
  // lives, after the packs queued so far and before the next ones: the sum of WordHash
  // over each piece (executor/word_hash.h). CollectHashes waits and returns the sums of
  // every piece queued since its last call, in order: the host never waits between batches.
  virtual absl::Status QueueHashes(absl::Span<const HashPiece> pieces) = 0;
  virtual absl::StatusOr<std::vector<uint64_t>> CollectHashes() = 0;
  // How long the copies and fills of the CopyLocal calls since the last call ran,
  // added up (after Synchronize): beside the rounds on a device, so the part of a sync
  // they explain.
  virtual absl::StatusOr<double> TakeLocalSeconds() = 0;
  // A client's ready event from its interprocess handle (CUDA only: the default refuses).
  virtual absl::StatusOr<std::shared_ptr<const ReadyEvent>> OpenReadyEvent(const std::string& handle);
  // Everything queued after this waits for each event's last record (read at this call).
  virtual absl::Status WaitFor(absl::Span<const std::shared_ptr<const ReadyEvent>> events);
};

// Host memory: every call copies at once.
class HostDevice final : public Device {
 public:
  absl::string_view name() const override { return "host"; }
  absl::StatusOr<uint8_t*> Staging(int32_t peer, bool send, int slot, int64_t bytes) override;
  absl::Status ReleaseStaging(int32_t peer, bool send) override;
  absl::Status Pack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const BufferTable& buffers,
                    uint8_t* out, int slot) override;
  absl::Status Unpack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const uint8_t* in,
                      const BufferTable& buffers, int slot) override;
  absl::Status Gather(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const BufferTable& buffers,
                      uint8_t* out, int slot) override;
  absl::Status BeforeTransfer(int) override { return absl::OkStatus(); }
  absl::Status AfterTransfer(int) override { return absl::OkStatus(); }
  absl::Status CopyLocal(const planner::Plan& plan, absl::Span<const int32_t> segments, absl::Span<const int32_t> fills,
                         const BufferTable& buffers) override;
  absl::Status CopyDirect(const planner::Plan& plan, absl::Span<const int32_t> segments,
                          const BufferTable& buffers) override;
  absl::Status FinishDirect() override { return absl::OkStatus(); }  // copied on return
  absl::Status Quantize(const planner::Plan& plan, absl::Span<const int32_t> quantizes,
                        const BufferTable& buffers) override;
  absl::Status Fence() override { return absl::OkStatus(); }  // every copy is done on return
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status QueueHashes(absl::Span<const HashPiece> pieces) override;
  absl::StatusOr<std::vector<uint64_t>> CollectHashes() override;
  absl::StatusOr<double> TakeLocalSeconds() override { return std::exchange(local_seconds_, 0); }

 private:
  struct StagingBuffer {
    std::unique_ptr<uint8_t[]> data;  // uninitialized: a page costs only once written
    int64_t bytes = 0;
  };
  std::map<std::tuple<int32_t, bool, int>, StagingBuffer> staging_;
  double local_seconds_ = 0;
  std::vector<uint64_t> hash_sums_;  // queued, not collected yet
};

}  // namespace shardsync::executor
