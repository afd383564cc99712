#include "daemon/agent/peer_desk.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/quantize.h"

namespace shardsync::agent {

void PeerDesk::Expect(const std::string& sync_id, PlannedWriters writers) {
  absl::MutexLock lock(&mu_);
  if (planned_.insert_or_assign(sync_id, std::move(writers)).second) planned_order_.push_back(sync_id);
  while (planned_order_.size() > kSyncsKept) {
    planned_.erase(planned_order_.front());
    planned_order_.pop_front();
  }
}

absl::StatusOr<std::set<std::string>> PeerDesk::PlannedFor(const std::string& sync_id, int32_t peer,
                                                           int64_t* scratch_bytes, bool* refused) {
  absl::MutexLock lock(&mu_);
  const auto known = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return planned_.count(sync_id) > 0; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&known), wait_)) {
    return absl::PermissionDeniedError(absl::StrCat("rank ", rank_, " has not prepared sync '", sync_id, "' (rank ",
                                                    peer, " asked for its target memory)"));
  }
  const PlannedWriters& planned = planned_.at(sync_id);
  *refused = planned.refused;
  if (planned.refused) return std::set<std::string>();
  const auto writes = planned.buffers.find(peer);
  if (writes == planned.buffers.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("sync '", sync_id, "' has rank ", peer, " write no target of rank ", rank_));
  }
  *scratch_bytes = planned.scratch_bytes;
  return writes->second;
}

absl::StatusOr<v1::TargetMemoryResponse> PeerDesk::TargetMemory(const v1::TargetMemoryRequest& request) {
  if (request.from_rank() < 0 || request.from_rank() == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("target memory asked for by rank ", request.from_rank()));
  }
  int64_t scratch_bytes = 0;
  bool refused = false;
  SHARDSYNC_ASSIGN_OR_RETURN(const std::set<std::string> planned,
                             PlannedFor(request.sync_id(), request.from_rank(), &scratch_bytes, &refused));
  v1::TargetMemoryResponse response;
  if (refused) {
    response.set_refused(true);
    return response;
  }
  for (const std::string& name : request.buffers()) {
    if (planned.count(name) == 0) {
      return absl::PermissionDeniedError(absl::StrCat("sync '", request.sync_id(), "' has rank ", request.from_rank(),
                                                      " write no buffer '", name, "' of rank ", rank_));
    }
  }
  if (std::count(request.buffers().begin(), request.buffers().end(), planner::kScratchBufferName) > 0) {
    if (request.scratch_bytes() != scratch_bytes) {
      return absl::PermissionDeniedError(absl::StrCat("rank ", request.from_rank(), " asked for a scratch of ",
                                                      request.scratch_bytes(), " bytes; sync '", request.sync_id(),
                                                      "' has ", scratch_bytes));
    }
    SHARDSYNC_RETURN_IF_ERROR(registry_.ProvideScratch(scratch_bytes));
  }
  std::vector<std::pair<std::string, int64_t>> handed;
  for (const std::string& name : request.buffers()) {
    int64_t registered_at = 0;
    SHARDSYNC_ASSIGN_OR_RETURN(v1::RegisteredBuffer buffer, registry_.TargetHandle(name, &registered_at));
    if (!buffer.handle().descriptor_token().empty()) {
      buffer.mutable_handle()->set_descriptor_socket(descriptor_socket_);
    }
    *response.add_buffers() = std::move(buffer);
    response.add_registered_at(registered_at);
    handed.emplace_back(name, registered_at);
  }
  absl::MutexLock lock(&mu_);
  handed_[request.from_rank()] = std::move(handed);
  return response;
}

absl::Status PeerDesk::CheckSendersMapped(const PreparedSync& prepared) const {
  absl::MutexLock lock(&mu_);
  for (const planner::Stage& stage : prepared.local->schedule.stages) {
    for (const planner::PeerStream& stream : stage.receives) {
      if (!std::binary_search(prepared.direct_peers.begin(), prepared.direct_peers.end(), stream.peer)) continue;
      const auto handed = handed_.find(stream.peer);
      if (handed == handed_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("rank ", stream.peer, " has not mapped the targets of rank ", rank_));
      }
      for (const auto& [name, registered_at] : handed->second) {
        const std::shared_ptr<const BufferEntry> entry = registry_.Find(name);
        if (!entry || entry->registered_at != registered_at) {
          return absl::FailedPreconditionError(absl::StrCat("rank ", stream.peer, " mapped buffer '", name,
                                                            "' of rank ", rank_, " before it was registered again"));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shardsync::agent
