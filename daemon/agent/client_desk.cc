#include "daemon/agent/client_desk.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace shardsync::agent {

absl::Status ClientDesk::Admit(const v1::RegisterRequest& request, const Peer& peer) {
  const bool source = request.role() == v1::SOURCE;
  std::vector<uint32_t> allowed = source ? config_.source_uids : config_.target_uids;
  if (allowed.empty()) allowed.push_back(geteuid());
  if (std::find(allowed.begin(), allowed.end(), peer.uid) == allowed.end()) {
    return absl::PermissionDeniedError(
        absl::StrCat("client '", request.client_id(), "' (uid ", peer.uid, ", pid ", peer.pid, ") may not register ",
                     source ? "sources" : "targets", ": this agent takes them from uid ",
                     absl::StrJoin(allowed, ", uid "), source ? " (--source-uids)" : " (--target-uids)"));
  }
  std::shared_ptr<const executor::ReadyEvent> ready_event;
  if (!request.ready_event().empty() && source) {
    absl::StatusOr<std::shared_ptr<const executor::ReadyEvent>> opened = device_.OpenReadyEvent(request.ready_event());
    if (!opened.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("client '", request.client_id(), "': ready event: ", opened.status().message()));
    }
    ready_event = *std::move(opened);
  }
  ClaimedDescriptors descriptors;
  for (const v1::RegisteredBuffer& b : request.buffers()) {
    const std::string& token = b.handle().descriptor_token();
    if (token.empty()) continue;
    if (descriptors_ == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("client '", request.client_id(), "' buffer '", b.name(),
                                                     "': this agent serves no descriptor socket"));
    }
    if (descriptors.count(token)) {
      return absl::InvalidArgumentError(absl::StrCat("client '", request.client_id(), "' buffer '", b.name(),
                                                     "': descriptor token '", token,
                                                     "' is named twice: each buffer passes its own"));
    }
    absl::StatusOr<std::vector<UniqueFd>> claimed = descriptors_->Claim(token, peer.pid);
    if (!claimed.ok()) {
      return absl::Status(claimed.status().code(), absl::StrCat("client '", request.client_id(), "' buffer '", b.name(),
                                                                "': ", claimed.status().message()));
    }
    descriptors[token] = *std::move(claimed);
  }
  SHARDSYNC_RETURN_IF_ERROR(registry_.Add(request, peer, std::move(ready_event), std::move(descriptors)));
  if (request.role() == v1::TARGET) ledger_.TargetsChanged();
  link_.Nudge();
  spdlog::info("client '{}' (pid {}, uid {}) registered {} buffers and {} tensors", request.client_id(), peer.pid,
               peer.uid, request.buffers_size(), request.tensors_size());
  return absl::OkStatus();
}

void ClientDesk::Withdraw(const std::string& client_id) {
  registry_.Remove(client_id);
  link_.Nudge();
  spdlog::info("client '{}' went away; its registrations are dropped", client_id);
}

int64_t ClientDesk::AwaitPublished() const {
  return link_.WaitPublished(registry_.version(), absl::Now() + config_.rpc_deadline);
}

}  // namespace shardsync::agent
