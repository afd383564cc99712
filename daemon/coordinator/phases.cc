// The coordinator's fan-outs to the agents: a communicator id, Prepare, Execute.
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/coordinator/coordinator.h"

namespace shardsync::coordinator {

absl::Status Coordinator::RenewCommunicator() {
  std::shared_ptr<AgentLink> root;
  {
    absl::MutexLock lock(&mu_);
    if (communicator_valid_) return absl::OkStatus();
    root = agents_.at(0).link;
  }
  const absl::StatusOr<std::string> id = root->NewCommunicatorId(absl::Now() + config_.rpc_deadline);
  if (!id.ok()) return absl::UnavailableError(absl::StrCat("rank 0 gave no communicator id: ", id.status().message()));
  communicator_id_ = *id;
  ++communicator_generation_;
  ready_digest_.clear();
  absl::MutexLock lock(&mu_);
  communicator_valid_ = true;
  return absl::OkStatus();
}

v1::PrepareRequest Coordinator::PrepareRequestFor(int32_t rank, bool with_schedule, const std::string& sync_id,
                                                  absl::Duration execute_deadline,
                                                  const std::map<int32_t, std::string>& addresses) {
  v1::PrepareRequest request = with_schedule ? *plan_->requests[rank] : v1::PrepareRequest();
  request.set_schedule_cached(!with_schedule);
  request.set_sync_id(sync_id);
  request.set_digest(plan_->digest);
  request.set_staging_bytes(config_.staging_bytes);
  request.set_deadline_ms(absl::ToInt64Milliseconds(execute_deadline));
  request.set_communicator_id(communicator_id_);
  request.set_communicator_generation(communicator_generation_);
  request.set_world_size(config_.world_size);
  // Every rank, not only those it sends to: Execute's agreement reaches all of them.
  for (const auto& [peer, address] : addresses) {
    if (peer != rank) (*request.mutable_peer_addresses())[peer] = address;
  }
  return request;
}

absl::Status Coordinator::PrepareAll(const std::string& sync_id, absl::Duration execute_deadline) {
  if (auto status = RenewCommunicator(); !status.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("sync ", sync_id, " refused, no byte moved: ", status.message()));
  }
  const std::map<int32_t, std::string> addresses = Addresses();
  const std::map<int32_t, std::shared_ptr<AgentLink>> links = Links();
  std::vector<std::string> refusals(config_.world_size);
  phase_pool_.Run([&](int32_t rank) {
    const bool cached = delivered_.count(rank) && delivered_.at(rank) == plan_->digest;
    for (bool send_schedule : {!cached, true}) {
      const v1::PrepareRequest request = PrepareRequestFor(rank, send_schedule, sync_id, execute_deadline, addresses);
      const absl::StatusOr<v1::PrepareResponse> response =
          links.at(rank)->Prepare(request, absl::Now() + config_.rpc_deadline);
      if (!response.ok()) {
        refusals[rank] = absl::StrCat("rank ", rank, " did not answer Prepare: ", response.status().message());
        return;
      }
      if (response->schedule_missing()) continue;  // resend with the schedule
      if (!response->ok()) refusals[rank] = absl::StrCat("rank ", rank, " refused: ", response->refusal());
      return;
    }
  });
  std::vector<std::string> refused;
  for (int32_t rank = 0; rank < config_.world_size; ++rank) {
    if (!refusals[rank].empty()) {
      refused.push_back(refusals[rank]);
      delivered_.erase(rank);
    } else {
      delivered_[rank] = plan_->digest;
    }
  }
  if (refused.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("sync ", sync_id, " refused, no byte moved: ",
                                                    absl::StrJoin(refused, "; ")));
}

bool Coordinator::OneCallReady() {
  absl::MutexLock lock(&mu_);
  // With a host transport the agreement is a message between every pair of agents,
  // dearer than the Prepare call it saves: only one agent, or agents that agree on
  // the device, get one call.
  bool ready = !ready_digest_.empty() && ready_digest_ == plan_->digest && communicator_valid_;
  for (const auto& [rank, entry] : agents_) {
    ready = ready && (config_.world_size == 1 || entry.join.fast_agreement());
  }
  return ready;
}

absl::StatusOr<std::vector<v1::ExecuteResponse>> Coordinator::ExecuteAll(const std::string& sync_id,
                                                                         absl::Duration timeout, bool verify,
                                                                         bool one_call) {
  const std::map<int32_t, std::shared_ptr<AgentLink>> links = Links();
  const std::map<int32_t, std::string> addresses = Addresses();
  std::vector<absl::Status> results(config_.world_size);
  std::vector<v1::ExecuteResponse> responses(config_.world_size);
  // The first rank that fails makes every rank abort at once: nobody waits out its
  // deadline on a peer that is gone.
  std::once_flag aborting;
  const auto abort_all = [&](int32_t failed, const std::string& why) {
    std::call_once(aborting, [&] {
      ForEachRank(config_.world_size, [&](int32_t rank) {
        v1::AbortRequest abort;
        abort.set_sync_id(sync_id);
        abort.set_reason(absl::StrCat("rank ", failed, ": ", why));
        links.at(rank)->Abort(abort, absl::Now() + config_.rpc_deadline).IgnoreError();  // the sync fails anyway
      });
    });
  };
  phase_pool_.Run([&](int32_t rank) {
    v1::ExecuteRequest execute;
    execute.set_sync_id(sync_id);
    execute.set_digest(plan_->digest);
    execute.set_verify(verify);
    if (one_call) *execute.mutable_prepare() = PrepareRequestFor(rank, false, sync_id, timeout, addresses);
    // The agent's own waits end at the timeout; this leaves it room to say so.
    absl::StatusOr<v1::ExecuteResponse> answer =
        links.at(rank)->Execute(execute, absl::Now() + timeout + config_.rpc_deadline);
    results[rank] = answer.status();
    if (answer.ok()) responses[rank] = *std::move(answer);
    if (!results[rank].ok()) abort_all(rank, std::string(results[rank].message()));
  });
  std::vector<std::string> failures;
  bool written = false;  // some rank finished, or failed after it may have written
  for (int32_t rank = 0; rank < config_.world_size; ++rank) {
    const absl::Status& status = results[rank];
    written = written || status.ok();
    if (status.ok()) continue;
    // A dead agent's call often ends with no message: its code says enough.
    written = written || !absl::IsFailedPrecondition(status);
    failures.push_back(absl::StrCat("rank ", rank, ": ", absl::StatusCodeToString(status.code()),
                                    status.message().empty() ? " (no answer)" : absl::StrCat(": ", status.message())));
  }
  if (!failures.empty()) {
    {
      absl::MutexLock lock(&mu_);
      communicator_valid_ = false;  // NCCL may have aborted it somewhere
      if (written) {
        invalid_target_ranks_.insert(plan_->target_ranks.begin(), plan_->target_ranks.end());
        synced_target_ranks_.insert(plan_->target_ranks.begin(), plan_->target_ranks.end());
      }
    }
    if (!written) {
      // Every rank stopped before writing (at the agreement, or each on its own).
      return absl::FailedPreconditionError(
          absl::StrCat("sync ", sync_id, " refused, no byte moved: ", absl::StrJoin(failures, "; ")));
    }
    delivered_.clear();
    return absl::UnavailableError(absl::StrCat("sync ", sync_id, " failed; targets are invalid until the next sync succeeds: ",
                                               absl::StrJoin(failures, "; ")));
  }
  return responses;
}

}  // namespace shardsync::coordinator
