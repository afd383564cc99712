#include "daemon/agent/peer_desk.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/quantize.h"

namespace shardsync::agent {

absl::StatusOr<v1::TargetMemoryResponse> PeerDesk::TargetMemory(const v1::TargetMemoryRequest& request) {
  if (request.from_rank() < 0 || request.from_rank() == rank_) {
    return absl::InvalidArgumentError(absl::StrCat("target memory asked for by rank ", request.from_rank()));
  }
  if (std::count(request.buffers().begin(), request.buffers().end(), planner::kScratchBufferName) > 0) {
    if (request.scratch_bytes() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", request.from_rank(), " asked for the scratch of rank ", rank_, " without its size"));
    }
    SHARDSYNC_RETURN_IF_ERROR(registry_.ProvideScratch(request.scratch_bytes()));
  }
  v1::TargetMemoryResponse response;
  std::vector<std::pair<std::string, int64_t>> handed;
  for (const std::string& name : request.buffers()) {
    int64_t registered_at = 0;
    SHARDSYNC_ASSIGN_OR_RETURN(*response.add_buffers(), registry_.TargetHandle(name, &registered_at));
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
