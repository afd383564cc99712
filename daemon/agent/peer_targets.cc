#include "daemon/agent/peer_targets.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "daemon/agent/descriptor_socket.h"
#include "proto/shardsync.grpc.pb.h"

namespace shardsync::agent {

PeerTargets::Ask PeerTargets::OverGrpc(PeerChannels& channels) {
  return [&channels](const std::string& address, const v1::TargetMemoryRequest& request,
                     absl::Time deadline) -> absl::StatusOr<v1::TargetMemoryResponse> {
    const std::shared_ptr<v1::AgentControl::Stub> stub = channels.Stub(address);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    // A peer that restarted on its port may find this channel still backing off from
    // the refused connections while it was down: wait for it, within the deadline.
    context.set_wait_for_ready(true);
    v1::TargetMemoryResponse response;
    const grpc::Status status = stub->TargetMemory(&context, request, &response);
    if (!status.ok()) return FromGrpcStatus(status);
    return response;
  };
}

absl::StatusOr<std::vector<std::shared_ptr<executor::MappedBuffer>>> PeerTargets::Map(
    int32_t peer, const std::string& address, const std::string& sync_id, const std::vector<std::string>& names,
    int64_t scratch_bytes, absl::Time deadline) {
  v1::TargetMemoryRequest request;
  request.set_from_rank(rank_);
  request.set_sync_id(sync_id);
  request.set_scratch_bytes(scratch_bytes);
  for (const std::string& name : names) request.add_buffers(name);
  const absl::StatusOr<v1::TargetMemoryResponse> response = ask_(address, request, deadline);
  if (!response.ok()) {
    return absl::Status(response.status().code(), absl::StrCat("rank ", peer,
                                                               " gave no target memory for the direct "
                                                               "path: ",
                                                               response.status().message()));
  }
  if (response->refused()) {
    absl::Status refused = absl::AbortedError(absl::StrCat("rank ", peer, " refused sync '", sync_id, "'"));
    refused.SetPayload(kPeerRefusedPayload, absl::Cord(sync_id));
    return refused;
  }
  if (response->buffers_size() != static_cast<int>(names.size()) ||
      response->registered_at_size() != response->buffers_size()) {
    return absl::InternalError(
        absl::StrCat("rank ", peer, " answered ", response->buffers_size(), " buffers for ", names.size(), " names"));
  }
  // Which mappings are kept, under the lock; the others are opened without it (a
  // fetch of descriptors asks the peer's process), then kept.
  std::vector<std::shared_ptr<executor::MappedBuffer>> mapped(names.size());
  std::vector<std::string> handles(names.size());
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < names.size(); ++i) {
      const v1::RegisteredBuffer& buffer = response->buffers(static_cast<int>(i));
      if (buffer.name() != names[i]) {
        return absl::InternalError(
            absl::StrCat("rank ", peer, " answered buffer '", buffer.name(), "' for '", names[i], "'"));
      }
      // The same handle registered again (a shared memory object made anew under its
      // name) is new memory: its registration's version tells.
      handles[i] = absl::StrCat(response->registered_at(static_cast<int>(i)), "/", buffer.SerializeAsString());
      auto kept = mappings_.find({peer, names[i]});
      if (kept != mappings_.end() && kept->second.handle == handles[i]) mapped[i] = kept->second.memory;
    }
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (mapped[i]) continue;
    absl::StatusOr<std::unique_ptr<executor::MappedBuffer>> opened =
        Open(response->buffers(static_cast<int>(i)), deadline);
    if (!opened.ok()) {
      absl::MutexLock lock(&mu_);
      mappings_.erase({peer, names[i]});
      return absl::FailedPreconditionError(
          absl::StrCat("buffer '", names[i], "' on rank ", peer, ": ", opened.status().message()));
    }
    mapped[i] = std::shared_ptr<executor::MappedBuffer>(*std::move(opened));
  }
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < names.size(); ++i) mappings_[{peer, names[i]}] = Mapping{handles[i], mapped[i]};
  // Buffers of the peer this schedule no longer writes: their mappings go (a sync that
  // holds one keeps it).
  for (auto it = mappings_.lower_bound({peer, ""}); it != mappings_.end() && it->first.first == peer;) {
    it = std::find(names.begin(), names.end(), it->first.second) == names.end() ? mappings_.erase(it) : std::next(it);
  }
  return mapped;
}

absl::StatusOr<std::unique_ptr<executor::MappedBuffer>> PeerTargets::Open(const v1::RegisteredBuffer& buffer,
                                                                          absl::Time deadline) const {
  std::vector<UniqueFd> descriptors;
  if (const std::string& token = buffer.handle().descriptor_token(); !token.empty()) {
    SHARDSYNC_ASSIGN_OR_RETURN(descriptors, FetchDescriptors(buffer.handle().descriptor_socket(), token, deadline));
  }
  return registry_.OpenPeer(buffer, descriptors);
}

}  // namespace shardsync::agent
