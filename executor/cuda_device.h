// One CUDA device: copies run as batched kernels on four streams beside the network
// stream the transport queues on: packs, unpacks, local copies and fills, and direct
// copies into peers' memory. Events
// per staging slot order pack -> transfer -> unpack -> reuse of the slot, so round k+1
// packs and round k-1 unpacks while round k is on the link. The network, pack and
// unpack streams run at the highest priority, so the local copies (which only need to
// end with the sync) do not hold the transfers back. Staging is device memory,
// allocated once per peer, direction and slot and reused.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "executor/copy_kernels.h"
#include "executor/device.h"

namespace shardsync::executor {

// A device as other agents of its host see it: its UUID, and those of the devices it
// can write by peer access (the direct path between agents of one host).
struct DeviceIdentity {
  std::string uuid;                     // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it
  std::vector<std::string> peer_uuids;  // the other visible devices cudaDeviceCanAccessPeer allows
};
absl::StatusOr<DeviceIdentity> IdentifyDevice(int ordinal);

class CudaDevice final : public Device {
 public:
  // Creates the streams on `ordinal`; fails when there is no such device.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Open(int ordinal);
  ~CudaDevice() override;

  absl::string_view name() const override { return "cuda"; }
  int ordinal() const { return ordinal_; }
  cudaStream_t network_stream() const { return streams_.network; }  // the transport queues here
  cudaStream_t unpack_stream() const { return streams_.unpack; }    // tests hold it to slow unpacks
  absl::StatusOr<uint8_t*> Staging(int32_t peer, bool send, int slot, int64_t bytes) override;
  absl::Status ReleaseStaging(int32_t peer, bool send) override;
  absl::Status Pack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const BufferTable& buffers,
                    uint8_t* out, int slot) override;
  absl::Status Unpack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const uint8_t* in,
                      const BufferTable& buffers, int slot) override;
  absl::Status BeforeTransfer(int slot) override;
  absl::Status AfterTransfer(int slot) override;
  absl::Status CopyLocal(const planner::Plan& plan, absl::Span<const int32_t> segments, absl::Span<const int32_t> fills,
                         const BufferTable& buffers) override;
  absl::Status CopyDirect(const planner::Plan& plan, absl::Span<const int32_t> segments,
                          const BufferTable& buffers) override;
  absl::Status FinishDirect() override;
  absl::Status Quantize(const planner::Plan& plan, absl::Span<const int32_t> quantizes,
                        const BufferTable& buffers) override;
  absl::Status Fence() override;
  absl::Status Synchronize() override;
  absl::Status QueueHashes(absl::Span<const HashPiece> pieces) override;
  absl::StatusOr<std::vector<uint64_t>> CollectHashes() override;
  absl::StatusOr<double> TakeLocalSeconds() override;
  // Opens a cudaIpcEventHandle_t; every stream waits for it in WaitFor.
  absl::StatusOr<std::shared_ptr<const ReadyEvent>> OpenReadyEvent(const std::string& handle) override;
  absl::Status WaitFor(absl::Span<const std::shared_ptr<const ReadyEvent>> events) override;

 private:
  // Descriptors of one launch and their device copy, per stream.
  struct Batch {
    std::vector<CopyDescriptor> descriptors;
    std::vector<int64_t> first_block;
    uint8_t* device = nullptr;  // descriptors, then first_block
    size_t capacity = 0;
  };
  struct Streams {
    cudaStream_t network, pack, unpack, local, direct;
    std::array<cudaStream_t, 5> all() const { return {network, pack, unpack, local, direct}; }
  };
  // Per staging slot: the last pack into it, the last transfer through it, the last
  // unpack out of it.
  struct SlotEvents {
    cudaEvent_t packed, transferred, unpacked;
  };
  using Slots = std::array<SlotEvents, planner::kStagingSlots>;
  CudaDevice(int ordinal, Streams streams, Slots slots, std::array<cudaEvent_t, 5> fence)
      : ordinal_(ordinal), streams_(streams), slots_(slots), fence_(fence) {}
  absl::Status Launch(Batch& batch, cudaStream_t stream);
  absl::Status SynchronizeAll();

  const int ordinal_;
  const Streams streams_;
  const Slots slots_;
  const std::array<cudaEvent_t, 5> fence_;  // one per stream
  // Around each CopyLocal on the local stream since the last TakeLocalSeconds: the
  // first `local_timed_` pairs (made as needed, reused).
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> local_events_;
  size_t local_timed_ = 0;
  // One descriptor batch per stream: a launch may overwrite only what its own stream
  // has finished reading.
  Batch pack_batch_;
  Batch unpack_batch_;
  Batch local_batch_;
  Batch direct_batch_;
  // Copies the sums queued on the device to hash_collected_.
  absl::Status DrainHashes();
  // QueueHashes: the last batch's pieces, and the sums of every piece queued (on the
  // pack stream, so a batch's hashes run after its packs and before the next ones).
  HashPiece* hash_pieces_ = nullptr;
  size_t hash_pieces_capacity_ = 0;
  uint64_t* hash_sums_ = nullptr;
  size_t hash_sums_capacity_ = 0;
  size_t hash_queued_ = 0;
  std::vector<uint64_t> hash_collected_;
  std::map<std::tuple<int32_t, bool, int>, std::pair<uint8_t*, int64_t>> staging_;
  // Quantize: the last launch's descriptors, on the local stream.
  std::vector<QuantizeDescriptor> quantize_descriptors_;
  QuantizeDescriptor* quantize_device_ = nullptr;
  size_t quantize_capacity_ = 0;  // descriptors
};

}  // namespace shardsync::executor
