#include "executor/nccl_transport.h"

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "executor/cuda_check.h"

namespace shardsync::executor {

NcclTransport::~NcclTransport() {
  Drop();
  if (vote_device_ != nullptr) cudaFree(vote_device_);
  if (vote_host_ != nullptr) cudaFreeHost(vote_host_);
}

void NcclTransport::Drop() {
  if (comm_ != nullptr) {
    cudaSetDevice(ordinal_);
    ncclCommAbort(comm_);  // safe whatever state the communicator is in
  }
  comm_ = nullptr;
  generation_ = -1;
}

absl::StatusOr<std::string> NcclTransport::NewCommunicatorId() {
  ncclUniqueId id;
  SHARDSYNC_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::Status NcclTransport::Await(absl::Time deadline, bool stream_too, const std::string& what) {
  // A nonblocking communicator launches every group from a thread of its own; the launch
  // takes tens of microseconds. Spinning for that long, then sleeping, keeps a round's
  // host cost near the launch (bench/round_bench times it) without holding a core
  // through a whole sync's wait in Finish.
  const absl::Time spin_until = absl::Now() + absl::Microseconds(200);
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    if (state != ncclSuccess && state != ncclInProgress) {
      const std::string error = ncclGetErrorString(state);
      Drop();
      return absl::UnavailableError(absl::StrCat(what, " failed: ", error, "; the communicator is aborted"));
    }
    const bool stream_done = !stream_too || cudaStreamQuery(stream_) == cudaSuccess;
    if (state == ncclSuccess && stream_done) return absl::OkStatus();
    if (aborted_) {
      Drop();
      return absl::AbortedError(absl::StrCat(what, " aborted"));
    }
    if (absl::Now() > deadline) {
      Drop();
      return absl::UnavailableError(
          absl::StrCat(what, " did not finish before the deadline; the communicator is aborted"));
    }
    if (absl::Now() < spin_until) {
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(20));
    }
  }
}

absl::Status NcclTransport::Setup(const PeerSetup& setup, absl::Time deadline) {
  // The id too: a restarted coordinator counts generations from the start again.
  if (comm_ != nullptr && setup.generation == generation_ && setup.communicator_id == communicator_id_) {
    return absl::OkStatus();
  }
  Drop();
  if (setup.communicator_id.size() != sizeof(ncclUniqueId)) {
    return absl::FailedPreconditionError("no NCCL communicator id was handed out for this sync");
  }
  ncclUniqueId id;
  std::memcpy(&id, setup.communicator_id.data(), sizeof(id));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so a missing peer cannot hang the init past the deadline
  if (auto s = NcclStatus(ncclCommInitRankConfig(&comm_, setup.world_size, id, setup.rank, &config),
                          "ncclCommInitRankConfig");
      !s.ok()) {
    comm_ = nullptr;
    return s;
  }
  SHARDSYNC_RETURN_IF_ERROR(
      Await(deadline, false, absl::StrCat("building the NCCL communicator of ", setup.world_size, " ranks")));
  generation_ = setup.generation;
  communicator_id_ = setup.communicator_id;
  return absl::OkStatus();
}

absl::Status NcclTransport::RunRound(absl::string_view sync_id, int32_t round, absl::Span<const SendOp> sends,
                                     absl::Span<const RecvOp> receives, absl::Time deadline) {
  if (comm_ == nullptr) return absl::FailedPreconditionError("no NCCL communicator: Setup first");
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  std::vector<int32_t> peers;
  ncclGroupStart();
  for (const RecvOp& r : receives) {  // receives first, then sends, in one group
    ncclRecv(r.data, static_cast<size_t>(r.bytes), ncclUint8, r.peer, comm_, stream_);
    peers.push_back(r.peer);
  }
  for (const SendOp& s : sends) {
    ncclSend(s.data, static_cast<size_t>(s.bytes), ncclUint8, s.peer, comm_, stream_);
    peers.push_back(s.peer);
  }
  if (auto s = NcclStatus(ncclGroupEnd(), "ncclGroupEnd"); !s.ok()) {
    Drop();
    return s;
  }
  queued_ = absl::StrCat("sync ", sync_id, " up to round ", round, " with rank ", absl::StrJoin(peers, ", rank "));
  // A nonblocking communicator takes no new call until the group is launched: wait for
  // that (not for the stream; Finish waits for the stream once).
  return Await(deadline, /*stream_too=*/false, queued_);
}

absl::StatusOr<bool> NcclTransport::Agree(absl::string_view sync_id, const PeerSetup& peers, bool ready,
                                          absl::Time deadline) {
  if (comm_ == nullptr) return absl::FailedPreconditionError("no NCCL communicator: Setup first");
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal_));
  if (vote_device_ == nullptr) SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMalloc(&vote_device_, 1));
  if (vote_host_ == nullptr) SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMallocHost(&vote_host_, 1));
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(vote_device_, ready ? 1 : 0, 1, stream_));
  const std::string what = absl::StrCat("sync ", sync_id, ": agreeing with ", peers.world_size - 1, " other ranks");
  if (auto s =
          NcclStatus(ncclAllReduce(vote_device_, vote_device_, 1, ncclUint8, ncclMin, comm_, stream_), "ncclAllReduce");
      !s.ok()) {
    Drop();
    return s;
  }
  SHARDSYNC_RETURN_IF_ERROR(Await(deadline, /*stream_too=*/false, what));  // launched
  SHARDSYNC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(vote_host_, vote_device_, 1, cudaMemcpyDeviceToHost, stream_));
  SHARDSYNC_RETURN_IF_ERROR(Await(deadline, /*stream_too=*/true, what));
  return *vote_host_ == 1;
}

absl::Status NcclTransport::Finish(absl::Time deadline) {
  if (comm_ == nullptr) return absl::OkStatus();
  return Await(deadline, true, queued_);
}

}  // namespace shardsync::executor
