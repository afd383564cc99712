// NCCL between agents: one communicator over all of them, built from an id the
// coordinator hands out (rank 0 makes it) and built again for every new generation
// (after a failed sync or an agent's return). Each round is one group of receives and
// sends on the device's stream. Errors are polled while the round runs, so a dead or
// stalled peer aborts the communicator (ncclCommAbort) by the deadline instead of
// hanging.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <string>

#include "executor/transport.h"

namespace shardsync::executor {

class NcclTransport final : public Transport {
 public:
  NcclTransport(int ordinal, cudaStream_t stream) : ordinal_(ordinal), stream_(stream) {}
  ~NcclTransport() override;

  absl::string_view name() const override { return "nccl"; }
  bool device_memory() const override { return true; }
  bool fast_agreement() const override { return true; }
  absl::Status Setup(const PeerSetup& setup, absl::Time deadline) override;
  absl::StatusOr<std::string> NewCommunicatorId() override;
  // Queues the round on the stream and returns: the host does not wait between rounds.
  absl::Status RunRound(absl::string_view sync_id, int32_t round, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> receives, absl::Time deadline) override;
  // One byte per rank reduced by minimum on the stream (an all-reduce of ranks' votes).
  absl::StatusOr<bool> Agree(absl::string_view sync_id, const PeerSetup& peers, bool ready,
                             absl::Time deadline) override;
  absl::Status Finish(absl::Time deadline) override;
  // Only one sync runs on a rank at a time, and Reset starts the next: a flag is enough.
  void Abort(absl::string_view, absl::string_view) override { aborted_ = true; }
  void Reset() override { aborted_ = false; }

 private:
  // Waits for the communicator's pending work and the stream; aborts it on an error,
  // an Abort or the deadline.
  absl::Status Await(absl::Time deadline, bool stream_too, const std::string& what);
  void Drop();

  const int ordinal_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  int64_t generation_ = -1;
  std::string communicator_id_;  // of generation_
  std::atomic<bool> aborted_{false};
  std::string queued_;              // what the queued rounds were, for an error message
  uint8_t* vote_device_ = nullptr;  // Agree's byte, made on first use
  uint8_t* vote_host_ = nullptr;    // pinned, for the answer
};

}  // namespace shardsync::executor
