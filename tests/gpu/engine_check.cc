// The round engine's double-buffered rounds on one GPU, every rank a thread with its own
// CudaDevice (its own pack, unpack, local and network streams). NCCL cannot put two
// ranks on one GPU, so the transfer here is a cudaMemcpyAsync into the receiver's posted
// buffer, ordered by events exactly as an NCCL group orders it: after the receiver's
// network stream reaches the round, and before the receiver's stream goes on. With
// --slow-link-us every transfer first holds its stream, so packs run far ahead of the
// link; with --slow-unpack-us every unpack does, so transfers run ahead of the unpacks:
// a slot reused too early either way shows as a wrong element. Random layouts and
// budgets; every element checked (tests/planner/sync_check.h).
//   engine_check [--seeds N] [--slow-link-us U] [--slow-unpack-us U]
// prints one JSON line, exits 1 on a mismatch.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/flags.h"
#include "executor/cuda_check.h"
#include "executor/cuda_device.h"
#include "executor/round_engine.h"
#include "planner/model.h"
#include "planner/schedule.h"
#include "tests/planner/random_layouts.h"
#include "tests/planner/sync_check.h"

namespace shardsync::executor {
namespace {

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
      return absl::UnavailableError(absl::StrCat("round ", std::get<0>(key), ": rank ", std::get<1>(key),
                                                 " -> rank ", std::get<2>(key), " never met"));
    }
    T value = from[key];
    from.erase(key);
    return value;
  }
  absl::Mutex mu_;
  std::map<Key, Posted> posted_ ABSL_GUARDED_BY(mu_);
  std::map<Key, cudaEvent_t> copied_ ABSL_GUARDED_BY(mu_);
};

void HoldStream(void* microseconds) { usleep(static_cast<useconds_t>(reinterpret_cast<intptr_t>(microseconds))); }

absl::Status Hold(cudaStream_t stream, int64_t microseconds) {
  if (microseconds <= 0) return absl::OkStatus();
  SHARDSYNC_CUDA_RETURN_IF_ERROR(
      cudaLaunchHostFunc(stream, HoldStream, reinterpret_cast<void*>(static_cast<intptr_t>(microseconds))));
  return absl::OkStatus();
}

// A CudaDevice whose unpack stream is held before every unpack.
class SlowUnpackDevice final : public Device {
 public:
  SlowUnpackDevice(CudaDevice& inner, int64_t microseconds) : inner_(inner), microseconds_(microseconds) {}
  absl::string_view name() const override { return inner_.name(); }
  absl::StatusOr<uint8_t*> Staging(int32_t peer, bool send, int slot, int64_t bytes) override {
    return inner_.Staging(peer, send, slot, bytes);
  }
  absl::Status ReleaseStaging(int32_t peer, bool send) override { return inner_.ReleaseStaging(peer, send); }
  absl::Status Pack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const BufferTable& buffers,
                    uint8_t* out, int slot) override {
    return inner_.Pack(plan, parts, buffers, out, slot);
  }
  absl::Status Unpack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts, const uint8_t* in,
                      const BufferTable& buffers, int slot) override {
    if (auto status = Hold(inner_.unpack_stream(), microseconds_); !status.ok()) return status;
    return inner_.Unpack(plan, parts, in, buffers, slot);
  }
  absl::Status BeforeTransfer(int slot) override { return inner_.BeforeTransfer(slot); }
  absl::Status AfterTransfer(int slot) override { return inner_.AfterTransfer(slot); }
  absl::Status CopyLocal(const planner::Plan& plan, absl::Span<const int32_t> segments, absl::Span<const int32_t> fills,
                         const BufferTable& buffers) override {
    return inner_.CopyLocal(plan, segments, fills, buffers);
  }
  absl::Status Synchronize() override { return inner_.Synchronize(); }
  absl::Status HashPieces(const uint8_t* data, absl::Span<const HashPiece> pieces, uint64_t* sums) override {
    return inner_.HashPieces(data, pieces, sums);
  }
  absl::StatusOr<double> LastLocalSeconds() override { return inner_.LastLocalSeconds(); }

 private:
  CudaDevice& inner_;
  const int64_t microseconds_;
};

class CopyTransport final : public Transport {
 public:
  CopyTransport(int32_t rank, Hub& hub, cudaStream_t stream, int64_t slow_link_us)
      : rank_(rank), hub_(hub), stream_(stream), slow_link_us_(slow_link_us) {}
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
      auto posted = hub_.TakePosted({round, rank_, s.peer}, deadline);
      if (!posted.ok()) return posted.status();
      if (posted->bytes != s.bytes) {
        return absl::InternalError(absl::StrCat("round ", round, ": rank ", rank_, " sends ", s.bytes,
                                                " bytes, rank ", s.peer, " expects ", posted->bytes));
      }
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, posted->ready, 0));
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventDestroy(posted->ready));
      if (auto status = Hold(stream_, slow_link_us_); !status.ok()) return status;
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(posted->data, s.data, s.bytes, cudaMemcpyDeviceToDevice, stream_));
      cudaEvent_t done;
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventRecord(done, stream_));
      hub_.Copied({round, rank_, s.peer}, done);
    }
    for (const RecvOp& r : receives) {
      auto done = hub_.TakeCopied({round, r.peer, rank_}, deadline);
      if (!done.ok()) return done.status();
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, *done, 0));
      SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaEventDestroy(*done));
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
  const int64_t slow_link_us_;
};

struct Outcome {
  int64_t rounds = 0;
  int64_t staged_peak = 0;
  std::string error;  // empty: every element right
};

// One random layout: device copies of the host buffers, every rank's engine on a thread,
// the buffers back, every element checked.
Outcome SyncOnce(uint64_t seed, int64_t slow_link_us, int64_t slow_unpack_us) {
  std::mt19937_64 rng(seed);
  auto input = planner::ExpandModel(testing::RandomModel(rng));
  if (!input.ok()) return {0, 0, std::string(input.status().message())};
  const int64_t budget = std::vector<int64_t>{16, 64, 256, 4096}[seed % 4];
  auto plan = planner::MakePlan(*input, *planner::LocalFirstLeastLoaded());
  if (!plan.ok()) return {0, 0, std::string(plan.status().message())};
  auto schedules = planner::MakeSchedules(*plan, budget);
  if (!schedules.ok()) return {0, 0, std::string(schedules.status().message())};

  testing::HostBuffers buffers = testing::AllocateBuffers(*input);
  const testing::TensorValues values = testing::PrepareBuffers(*input, rng, buffers);
  const testing::HostBuffers before = buffers;
  std::map<planner::Holder, uint8_t*> device_buffers;
  std::vector<BufferTable> tables(plan->num_ranks);
  for (auto& [holder, bytes] : buffers) {
    uint8_t* memory = nullptr;
    if (cudaMalloc(&memory, std::max<size_t>(bytes.size(), 1)) != cudaSuccess ||
        cudaMemcpy(memory, bytes.data(), bytes.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
      return {0, 0, "cudaMalloc/cudaMemcpy failed"};
    }
    device_buffers[holder] = memory;
    BufferTable& table = tables[holder.rank];
    if (static_cast<int32_t>(table.size()) <= holder.buffer) table.resize(holder.buffer + 1, nullptr);
    table[holder.buffer] = memory;
  }
  Hub hub;
  std::vector<absl::StatusOr<ExecutionStats>> results(plan->num_ranks, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < plan->num_ranks; ++r) {
    threads.emplace_back([&, r] {
      auto device = CudaDevice::Open(0);
      if (!device.ok()) {
        results[r] = device.status();
        return;
      }
      CopyTransport transport(r, hub, (*device)->network_stream(), slow_link_us);
      SlowUnpackDevice slow(**device, slow_unpack_us);
      RoundEngine engine(slow, transport);
      results[r] = engine.Run("check", *plan, (*schedules)[r], tables[r], budget, absl::Now() + absl::Seconds(60));
    });
  }
  for (std::thread& t : threads) t.join();
  Outcome outcome;
  for (int32_t r = 0; r < plan->num_ranks; ++r) {
    if (!results[r].ok()) {
      outcome.error = absl::StrCat("rank ", r, ": ", results[r].status().message());
    } else {
      outcome.rounds = std::max<int64_t>(outcome.rounds, results[r]->rounds);
      outcome.staged_peak = std::max(outcome.staged_peak, results[r]->peak_peer_staging_bytes);
    }
  }
  for (auto& [holder, memory] : device_buffers) {
    std::vector<uint8_t>& bytes = buffers[holder];
    if (cudaMemcpy(bytes.data(), memory, bytes.size(), cudaMemcpyDeviceToHost) != cudaSuccess) {
      outcome.error = "copying a buffer back failed";
    }
    cudaFree(memory);
  }
  if (!outcome.error.empty()) return outcome;
  const std::vector<std::string> errors = testing::CheckSync(*input, values, before, buffers);
  if (!errors.empty()) outcome.error = errors.front();
  if (outcome.staged_peak > budget) outcome.error = absl::StrCat("staging of ", outcome.staged_peak, " > budget ", budget);
  return outcome;
}

}  // namespace
}  // namespace shardsync::executor

int main(int argc, char** argv) {
  shardsync::Flags flags(argc, argv, 1);
  const int64_t seeds = flags.TakeNumber<int64_t>("seeds", 200);
  const int64_t slow_link_us = flags.TakeNumber<int64_t>("slow-link-us", 0);
  const int64_t slow_unpack_us = flags.TakeNumber<int64_t>("slow-unpack-us", 0);
  if (!flags.error().empty() || !flags.Leftover().empty()) {
    std::fprintf(stderr, "usage: engine_check [--seeds N] [--slow-link-us U] [--slow-unpack-us U]\n");
    return 2;
  }
  int64_t rounds = 0, failed = 0;
  std::string first_error;
  for (uint64_t seed = 1; seed <= static_cast<uint64_t>(seeds); ++seed) {
    const shardsync::executor::Outcome outcome = shardsync::executor::SyncOnce(seed, slow_link_us, slow_unpack_us);
    rounds += outcome.rounds;
    if (!outcome.error.empty()) {
      ++failed;
      if (first_error.empty()) first_error = absl::StrCat("seed ", seed, ": ", outcome.error);
      std::replace(first_error.begin(), first_error.end(), '"', '\'');
    }
  }
  std::printf(
      "{\"seeds\": %lld, \"slow_link_us\": %lld, \"slow_unpack_us\": %lld, \"rounds\": %lld, \"failed\": %lld, "
      "\"first_error\": \"%s\"}\n",
      static_cast<long long>(seeds), static_cast<long long>(slow_link_us), static_cast<long long>(slow_unpack_us),
      static_cast<long long>(rounds),
              static_cast<long long>(failed), first_error.c_str());
  return failed == 0 ? 0 : 1;
}
