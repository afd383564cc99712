// Helpers of tests/gpu/engine_check.cc: ways to run the round engine's rounds on one GPU
// (ranks that NCCL cannot put on one GPU joined by peer copies; one rank's streams with
// itself over NCCL), and a device that slows one side down.
#pragma once

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "executor/cuda_check.h"
#include "executor/cuda_device.h"
#include "executor/transport.h"
#include "tests/executor/forwarding_device.h"

namespace shardsync::executor::testing {

// Where the ranks of one sync meet: (round, from, to) -> the receiver's posted buffer
// and the event its stream recorded there; then the event after the sender's copy.
class Hub {
 public:
  struct Posted {
    uint8_t* data = nullptr;
    int64_t bytes = 0;
    cudaEvent_t ready = nullptr;
  };
  using Key = std::tuple<int32_t, int32_t, int32_t>;

  void Post(Key key, Posted posted) {
    absl::MutexLock lock(&mu_);
    posted_[key] = posted;
  }
  absl::StatusOr<Posted> TakePosted(Key key, absl::Time deadline) { return Take(posted_, key, deadline); }
  void Copied(Key key, cudaEvent_t done) {
    absl::MutexLock lock(&mu_);
    copied_[key] = done;
  }
  absl::StatusOr<cudaEvent_t> TakeCopied(Key key, absl::Time deadline) { return Take(copied_, key, deadline); }

 private:
  template <typename T>
  absl::StatusOr<T> Take(std::map<Key, T>& from, Key key, absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    const auto present = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return from.count(key) > 0; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&present), deadline)) {
      return absl::UnavailableError(absl::StrCat("round ", std::get<0>(key), ": rank ", std::get<1>(key), " -> rank ",
                                                 std::get<2>(key), " never met"));
    }
    T value = from[key];
    from.erase(key);
    return value;
  }
  absl::Mutex mu_;
  std::map<Key, Posted> posted_ ABSL_GUARDED_BY(mu_);
  std::map<Key, cudaEvent_t> copied_ ABSL_GUARDED_BY(mu_);
};

inline void HoldStream(void* microseconds) {
  usleep(static_cast<useconds_t>(reinterpret_cast<intptr_t>(microseconds)));
}

inline absl::Status Hold(cudaStream_t stream, int64_t microseconds) {
  if (microseconds <= 0) return absl::OkStatus();
  SHARDSYNC_CUDA_RETURN_IF_ERROR(
      cudaLaunchHostFunc(stream, HoldStream, reinterpret_cast<void*>(static_cast<intptr_t>(microseconds))));
  return absl::OkStatus();
}

// A CudaDevice whose network stream is held before every transfer (a slow link) and
// whose unpack stream is held before every unpack (slow unpacks).
class HeldDevice final : public shardsync::testing::ForwardingDevice {
 public:
  HeldDevice(CudaDevice& inner, int64_t link_us, int64_t unpack_us)
      : ForwardingDevice(inner), cuda_(inner), link_us_(link_us), unpack_us_(unpack_us) {}
  absl::Status Unpack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const uint8_t* in,
                      const BufferTable& buffers, int slot) override {
    SHARDSYNC_RETURN_IF_ERROR(Hold(cuda_.unpack_stream(), unpack_us_));
    return ForwardingDevice::Unpack(plan, parts, in, buffers, slot);
  }
  absl::Status BeforeTransfer(int slot) override {
    SHARDSYNC_RETURN_IF_ERROR(ForwardingDevice::BeforeTransfer(slot));
    return Hold(cuda_.network_stream(), link_us_);
  }

 private:
  CudaDevice& cuda_;
  const int64_t link_us_;
  const int64_t unpack_us_;
};

// Every rank of one process on one GPU: a round's send is a cudaMemcpyAsync into the
// receiver's posted buffer, queued on the sender's network stream after the receiver's
// stream reached the round, and the receiver's stream waits for the copy: the ordering
// an NCCL group gives, between ranks that NCCL cannot put on one GPU.
class CopyTransport final : public Transport {
 public:
  CopyTransport(int32_t rank, Hub& hub, cudaStream_t stream) : rank_(rank), hub_(hub), stream_(stream) {}
  absl::string_view name() const override { return "cuda-copy"; }
  bool device_memory() const override { return true; }
  absl::Status Setup(const PeerSetup&, absl::Time) override { return absl::OkStatus(); }
  absl::Status RunRound(absl::string_view, int32_t round, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> receives, absl::Time deadline) override {
    for (const RecvOp& r : receives) {
      cudaEvent_t ready;
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(ready, stream_));
      hub_.Post({round, r.peer, rank_}, {r.data, r.bytes, ready});
    }
    for (const SendOp& s : sends) {
      SHARDSYNC_ASSIGN_OR_RETURN(auto posted, hub_.TakePosted({round, rank_, s.peer}, deadline));
      if (posted.bytes != s.bytes) {
        return absl::InternalError(absl::StrCat("round ", round, ": rank ", rank_, " sends ", s.bytes, " bytes, rank ",
                                                s.peer, " expects ", posted.bytes));
      }
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, posted.ready, 0));
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventDestroy(posted.ready));
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(posted.data, s.data, s.bytes, cudaMemcpyDeviceToDevice, stream_));
      cudaEvent_t done;
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, stream_));
      hub_.Copied({round, rank_, s.peer}, done);
    }
    for (const RecvOp& r : receives) {
      SHARDSYNC_ASSIGN_OR_RETURN(cudaEvent_t done, hub_.TakeCopied({round, r.peer, rank_}, deadline));
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, done, 0));
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventDestroy(done));
    }
    return absl::OkStatus();
  }
  absl::Status Finish(absl::Time) override {
    SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  void Abort(absl::string_view, absl::string_view) override {}
  void Reset() override {}

 private:
  const int32_t rank_;
  Hub& hub_;
  cudaStream_t stream_;
};

// Many streams of one rank with itself over a one-rank NCCL communicator: the engine
// sees each stream under its own peer id (so each has its own staging), NCCL sees
// peer 0. Receives and sends are posted in the same stream order, so NCCL pairs the
// k-th send to itself with the k-th receive.
class SelfTransport final : public Transport {
 public:
  explicit SelfTransport(Transport& nccl) : nccl_(nccl) {}
  absl::string_view name() const override { return "nccl-self"; }
  bool device_memory() const override { return true; }
  absl::Status Setup(const PeerSetup& setup, absl::Time deadline) override { return nccl_.Setup(setup, deadline); }
  absl::Status RunRound(absl::string_view sync_id, int32_t round, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> receives, absl::Time deadline) override {
    std::vector<SendOp> to_self(sends.begin(), sends.end());
    std::vector<RecvOp> from_self(receives.begin(), receives.end());
    for (SendOp& s : to_self) s.peer = 0;
    for (RecvOp& r : from_self) r.peer = 0;
    return nccl_.RunRound(sync_id, round, to_self, from_self, deadline);
  }
  absl::Status Finish(absl::Time deadline) override { return nccl_.Finish(deadline); }
  void Abort(absl::string_view sync_id, absl::string_view reason) override { nccl_.Abort(sync_id, reason); }
  void Reset() override { nccl_.Reset(); }

 private:
  Transport& nccl_;
};

}  // namespace shardsync::executor::testing
