#include "daemon/coordinator/sync_runner.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/polling.h"
#include "common/status_macros.h"
#include "daemon/common/plan_report.h"
#include "daemon/coordinator/layouts.h"
#include "spdlog/spdlog.h"

namespace shardsync::coordinator {
namespace {

// Up to this many ranks, the thread that took the sync sends every Execute itself (one
// node's GPUs: a request with the agreement's peers costs microseconds to build); beyond
// it, each pool thread builds and sends its own rank's, since a request grows with the
// world.
constexpr int32_t kExecutesSentByCaller = 8;

// How many ranks refused for another build a refused sync names; it counts the rest.
constexpr size_t kRefusalsNamed = 3;

// The rank of the agent serving the coordinator in this process, whose calls then run
// on the thread that took the sync; else 0.
int32_t CallerRank(const std::map<int32_t, std::shared_ptr<AgentLink>>& links) {
  for (const auto& [rank, link] : links) {
    if (link->InProcess()) return rank;
  }
  return 0;
}

// sync --verify: the checksums of every rank added up per (tensor, target rank); the
// number of pairs compared, or which differ. The pairs in `quantized` (block-quantized
// targets: float8, not their sources' bytes) are left out and counted in `skipped`.
absl::StatusOr<int32_t> CompareChecksums(const std::vector<v1::ExecuteResponse>& responses,
                                         const std::set<std::pair<std::string, int32_t>>& quantized, int32_t* skipped) {
  std::map<std::pair<std::string, int32_t>, std::pair<uint64_t, uint64_t>> sums;  // sources, targets
  *skipped = static_cast<int32_t>(quantized.size());
  for (const v1::ExecuteResponse& response : responses) {
    for (const v1::TensorChecksum& c : response.checksums()) {
      if (quantized.count({c.tensor(), c.target_rank()})) continue;
      auto& [sources, targets] = sums[{c.tensor(), c.target_rank()}];
      sources += c.sources();
      targets += c.targets();
    }
  }
  std::vector<std::string> differ;
  for (const auto& [key, side] : sums) {
    if (side.first != side.second) differ.push_back(absl::StrCat("tensor ", key.first, " on rank ", key.second));
  }
  if (!differ.empty()) {
    const size_t shown = std::min<size_t>(differ.size(), 10);
    return absl::DataLossError(absl::StrCat(
        "verify failed: the targets differ from their sources in ", differ.size(), " placement(s): ",
        absl::StrJoin(differ.begin(), differ.begin() + shown, "; "), differ.size() > shown ? "; ..." : ""));
  }
  return static_cast<int32_t>(sums.size());
}

}  // namespace

absl::Duration SyncTimeout(int64_t requested_ms, absl::Duration configured) {
  return requested_ms > 0 ? std::min(absl::Milliseconds(requested_ms), configured) : configured;
}

SyncRunner::SyncRunner(SyncOptions options, std::string instance_id, AgentDirectory& directory,
                       TargetValidity& validity)
    : options_(std::move(options)),
      instance_id_(std::move(instance_id)),
      directory_(directory),
      validity_(validity),
      phase_pool_(options_.epoch.world_size),
      plans_(directory_, options_.epoch) {}

absl::StatusOr<std::vector<int32_t>> SyncRunner::SelectTargetRanks(
    const google::protobuf::RepeatedField<int32_t>& requested) const {
  std::set<int32_t> unique(requested.begin(), requested.end());
  if (unique.empty()) return std::vector<int32_t>();
  const std::vector<int32_t> holding = directory_.TargetRanks();
  const int32_t world = options_.epoch.world_size;
  for (int32_t rank : unique) {
    if (rank < 0 || rank >= world) {
      return absl::InvalidArgumentError(absl::StrCat("target rank ", rank, " is outside a world of ", world));
    }
    if (!std::binary_search(holding.begin(), holding.end(), rank)) {
      return absl::InvalidArgumentError(
          absl::StrCat("target rank ", rank, " holds no target to write (targets are registered on ",
                       holding.empty() ? "no rank" : "rank " + absl::StrJoin(holding, ", rank "), ")"));
    }
  }
  return std::vector<int32_t>(unique.begin(), unique.end());
}

absl::StatusOr<bool> SyncRunner::UsePlan(const std::vector<int32_t>& target_ranks) {
  bool planned = false;
  SHARDSYNC_ASSIGN_OR_RETURN(plan_, plans_.Get(target_ranks, &planned));
  if (planned) {
    delivered_.clear();
    ready_digest_.clear();
  }
  return planned;
}

void SyncRunner::ReleaseStalePlans() {
  if (!sync_mu_.TryLock()) return;  // the running sync releases them when it ends
  ReleaseStalePlansLocked();
  sync_mu_.Unlock();
}

void SyncRunner::ReleaseStalePlansLocked() {
  if (plans_.ReleaseStale()) plan_ = nullptr;
}

absl::StatusOr<v1::SyncResponse> SyncRunner::Sync(const v1::SyncRequest& request) {
  absl::MutexLock sync_lock(&sync_mu_);
  const absl::Time start = absl::Now();
  const std::string sync_id = absl::StrCat("sync-", instance_id_.substr(instance_id_.size() - 6), "-", ++syncs_);
  const absl::Duration timeout = SyncTimeout(request.timeout_ms(), options_.sync_timeout);
  record_.Started(sync_id);
  const auto finish = [&](absl::Status status) -> absl::Status {
    record_.Finished(sync_id, status, absl::ToDoubleSeconds(absl::Now() - start));
    ReleaseStalePlansLocked();  // layouts published while it ran
    return status;
  };
  if (const std::map<int32_t, std::string> refused = directory_.RefusedJoins(); !refused.empty()) {
    std::vector<std::string> reasons;  // a few, and how many more
    for (const auto& [rank, why] : refused) {
      if (reasons.size() == kRefusalsNamed) break;
      reasons.push_back(why);
    }
    if (refused.size() > kRefusalsNamed)
      reasons.push_back(absl::StrCat(refused.size() - kRefusalsNamed, " more ranks"));
    return finish(absl::FailedPreconditionError(
        absl::StrCat("sync ", sync_id, " refused, no byte moved: ", absl::StrJoin(reasons, "; "))));
  }
  if (const std::vector<int32_t> missing = directory_.MissingRanks(); !missing.empty()) {
    return finish(absl::FailedPreconditionError(absl::StrCat(
        "rank ", absl::StrJoin(missing, ", rank "), " has not joined (world of ", options_.epoch.world_size, ")")));
  }
  const absl::StatusOr<std::vector<int32_t>> target_ranks = SelectTargetRanks(request.target_ranks());
  if (!target_ranks.ok()) {
    return finish(absl::InvalidArgumentError(
        absl::StrCat("sync ", sync_id, " refused, no byte moved: ", target_ranks.status().message())));
  }
  const absl::StatusOr<bool> planned = UsePlan(*target_ranks);
  if (!planned.ok()) {
    return finish(absl::FailedPreconditionError(
        absl::StrCat("sync ", sync_id, " refused, no byte moved: ", planned.status().message())));
  }
  const absl::Time prepare_start = absl::Now();
  const AgentDirectory::Contacts contacts = directory_.CurrentContacts();
  const bool one_call = OneCallReady(contacts);
  if (!one_call) {
    if (auto status = PrepareAll(sync_id, timeout, contacts); !status.ok()) return finish(status);
  }
  ready_digest_.clear();  // until this sync succeeds
  const absl::Time execute_start = absl::Now();
  absl::StatusOr<std::vector<v1::ExecuteResponse>> responses =
      ExecuteAll(sync_id, timeout, request, one_call, contacts);
  if (!responses.ok()) return finish(responses.status());
  const absl::Time executed = absl::Now();
  v1::SyncResponse response;
  if (request.verify()) {
    if (const absl::Status verified = CheckVerified(*responses, response); !verified.ok()) {
      validity_.PartlyWritten(plan_->target_ranks);
      return finish(absl::DataLossError(absl::StrCat("sync ", sync_id, " ", verified.message())));
    }
  }
  validity_.Written(plan_->target_ranks, !plan_->partial, sync_id);
  ready_digest_ = plan_->compiled.digest();
  response.set_one_call(one_call);
  response.set_host_copies(contacts.host_copies);
  response.set_sync_id(sync_id);
  response.set_plan_seconds(*planned ? plan_->plan_seconds : 0);
  if (!one_call) response.set_prepare_seconds(absl::ToDoubleSeconds(execute_start - prepare_start));
  response.set_execute_seconds(absl::ToDoubleSeconds(executed - execute_start));
  FillFromPlan(*responses, request.links(), response);
  response.set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  record_.AddMoved(response);
  finish(absl::OkStatus()).IgnoreError();
  return response;
}

absl::Status SyncRunner::CheckVerified(const std::vector<v1::ExecuteResponse>& responses,
                                       v1::SyncResponse& response) const {
  const planner::Plan& plan = plan_->compiled.planned.plan;
  std::set<std::pair<std::string, int32_t>> quantized;
  for (const planner::QuantizeOp& q : plan.quantizes) quantized.emplace(plan.tensor_names[q.tensor], q.target.rank);
  int32_t skipped = 0;
  SHARDSYNC_ASSIGN_OR_RETURN(const int32_t compared, CompareChecksums(responses, quantized, &skipped));
  response.set_verified_placements(compared);
  response.set_unverified_quantized_placements(skipped);
  return absl::OkStatus();
}

void SyncRunner::FillFromPlan(std::vector<v1::ExecuteResponse>& responses, bool links,
                              v1::SyncResponse& response) const {
  response.set_layout_epoch(plan_->epoch);
  response.set_digest(plan_->compiled.digest());
  const planner::StreamedPlan& planned = plan_->compiled.planned;
  response.set_stages(planned.plan.stages);
  response.set_network_bytes(planned.stats.total_network_bytes);
  response.set_relayed_bytes(planned.stats.total_relayed_bytes);
  response.mutable_target_ranks()->Add(plan_->target_ranks.begin(), plan_->target_ranks.end());
  if (links) {
    std::map<std::pair<int32_t, int32_t>, const v1::PeerWire*> wire;  // by (sender, receiver)
    for (const v1::ExecuteResponse& r : responses) {
      for (const v1::PeerWire& peer : r.stats().peer_wire()) wire[{r.stats().rank(), peer.peer()}] = &peer;
    }
    for (v1::LinkBytes& link : LinksOfPlan()) {
      if (const auto sent = wire.find({link.from_rank(), link.to_rank()}); sent != wire.end()) {
        link.set_wire_bytes(sent->second->wire_bytes());
        link.set_changed_words(sent->second->changed_words());
      }
      *response.add_links() = std::move(link);
    }
  }
  for (v1::ExecuteResponse& r : responses) {
    response.set_quantized_bytes(response.quantized_bytes() + r.stats().quantized_bytes());
    *response.add_ranks() = std::move(*r.mutable_stats());
  }
}

absl::StatusOr<v1::ExplainResponse> SyncRunner::Explain(const v1::ExplainRequest& request) {
  absl::MutexLock sync_lock(&sync_mu_);
  SHARDSYNC_ASSIGN_OR_RETURN(const std::vector<int32_t> target_ranks, SelectTargetRanks(request.target_ranks()));
  SHARDSYNC_RETURN_IF_ERROR(UsePlan(target_ranks).status());
  const CachedPlan& cached = *plan_;
  const planner::Bandwidths& configured = options_.epoch.bandwidths;
  const auto speed = [](double gbps, double fallback) { return gbps > 0 ? gbps * 1e9 : fallback; };
  const planner::Bandwidths bandwidths{speed(request.link_gbps(), configured.link_bytes_per_s),
                                       speed(request.memory_gbps(), configured.memory_bytes_per_s),
                                       speed(request.network_gbps(), configured.network_bytes_per_s)};
  const planner::StreamedPlan& planned = cached.compiled.planned;
  v1::ExplainResponse response =
      daemon::MakePlanReport(planned.plan, planned.stats, planned.digest, planned.floors, bandwidths, request.links());
  response.set_layout_epoch(cached.epoch);
  // Paths need every agent, and agents the coordinator can link (a sync would say
  // why not); without them the ranks and links say none.
  if (directory_.MissingRanks().empty() && EnsureLinkPaths().ok()) {
    const auto rank = [&](int32_t r) { return response.mutable_ranks(r); };  // ranks in order, one each
    for (const auto& [link, bytes] : planned.stats.link_bytes) {
      if (paths_.Path(link.first, link.second) != v1::DIRECT) continue;
      rank(link.first)->set_direct_sent_bytes(rank(link.first)->direct_sent_bytes() + bytes);
      rank(link.second)->set_direct_received_bytes(rank(link.second)->direct_received_bytes() + bytes);
    }
    for (v1::RankStats& r : *response.mutable_ranks()) r.set_staged_sent_bytes(r.sent_bytes() - r.direct_sent_bytes());
    for (v1::LinkBytes& link : *response.mutable_links()) link.set_path(paths_.Path(link.from_rank(), link.to_rank()));
  }
  ReleaseStalePlansLocked();  // layouts published while it planned
  return response;
}

void SyncRunner::FillStatus(v1::CoordinatorStatus* status) const {
  record_.FillStatus(status);
  if (status->running_sync_id().empty()) return;
  // While a sync runs, ask every agent how far it is (briefly: a status must not hang).
  const std::map<int32_t, std::shared_ptr<AgentLink>> links = directory_.Links();
  const absl::Time deadline = absl::Now() + absl::Milliseconds(500);
  std::vector<std::pair<int32_t, std::unique_ptr<StartedCall<v1::RankProgress>>>> calls;
  for (const auto& [rank, link] : links) calls.emplace_back(rank, link->StartProgress(deadline));
  for (auto& [rank, call] : calls) {
    absl::StatusOr<v1::RankProgress> answer = call->Await();
    v1::RankProgress* progress = status->add_progress();
    if (answer.ok()) *progress = *std::move(answer);
    progress->set_rank(rank);
  }
}

void SyncRunner::AppendMetrics(std::string* out) const { record_.AppendMetrics(out); }

bool SyncRunner::CommunicatorValid() const {
  return communicator_membership_version_ >= 0 && communicator_membership_version_ == directory_.membership_version();
}

absl::Status SyncRunner::EnsureLinkPaths() {
  const int64_t membership = directory_.membership_version();
  if (paths_membership_version_ == membership) return absl::OkStatus();
  SHARDSYNC_ASSIGN_OR_RETURN(paths_, ChooseLinkPaths(directory_.Joins(), options_.direct));
  paths_membership_version_ = membership;
  return absl::OkStatus();
}

std::vector<v1::LinkBytes> SyncRunner::LinksOfPlan() const {
  std::vector<v1::LinkBytes> links = daemon::LinksOf(plan_->compiled.planned.stats);
  for (v1::LinkBytes& link : links) link.set_path(paths_.Path(link.from_rank(), link.to_rank()));
  return links;
}

absl::Status SyncRunner::RenewCommunicator() {
  if (CommunicatorValid()) return absl::OkStatus();
  const int64_t membership = directory_.membership_version();
  SHARDSYNC_RETURN_IF_ERROR(EnsureLinkPaths());
  std::string fresh;  // no link needs NCCL: no communicator
  if (paths_.needs_communicator) {
    const std::map<int32_t, std::shared_ptr<AgentLink>> links = directory_.Links();
    const absl::StatusOr<std::string> id = links.at(0)->NewCommunicatorId(absl::Now() + options_.rpc_deadline);
    if (!id.ok()) {
      return absl::UnavailableError(absl::StrCat("rank 0 gave no communicator id: ", id.status().message()));
    }
    fresh = *id;
  }
  communicator_id_ = fresh;
  ++communicator_generation_;
  communicator_membership_version_ = membership;
  ready_digest_.clear();
  return absl::OkStatus();
}

v1::PrepareRequest SyncRunner::PrepareRequestFor(int32_t rank, std::optional<v1::PrepareRequest> schedule,
                                                 const std::string& sync_id, absl::Duration execute_deadline,
                                                 const std::map<int32_t, std::string>* addresses) {
  const bool cached = !schedule.has_value();
  v1::PrepareRequest request = cached ? v1::PrepareRequest() : *std::move(schedule);
  request.set_schedule_cached(cached);
  request.set_sync_id(sync_id);
  request.set_digest(plan_->compiled.digest());
  request.set_staging_bytes(options_.epoch.staging_bytes);
  request.set_deadline_ms(absl::ToInt64Milliseconds(execute_deadline));
  request.set_communicator_id(communicator_id_);
  request.set_communicator_generation(communicator_generation_);
  request.set_world_size(options_.epoch.world_size);
  for (int32_t peer : paths_.DirectPeers(rank)) request.add_direct_peers(peer);
  request.set_agree_in_execute(paths_.any_direct);
  if (addresses == nullptr) {  // one call: the agent holds this generation's peers
    request.set_peers_cached(true);
    return request;
  }
  // Every rank, not only those it sends to: Execute's agreement reaches all of them.
  for (const auto& [peer, address] : *addresses) {
    if (peer != rank) (*request.mutable_peer_addresses())[peer] = address;
  }
  request.mutable_peer_signal_boards()->insert(paths_.signal_boards[rank].begin(), paths_.signal_boards[rank].end());
  return request;
}

absl::Status SyncRunner::PrepareAll(const std::string& sync_id, absl::Duration execute_deadline,
                                    const AgentDirectory::Contacts& contacts) {
  if (auto status = RenewCommunicator(); !status.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("sync ", sync_id, " refused, no byte moved: ", status.message()));
  }
  const std::map<int32_t, std::shared_ptr<AgentLink>>& links = contacts.links;
  const int32_t world = options_.epoch.world_size;
  std::vector<std::string> refusals(world);
  std::vector<char> peer_refused(world, 0);  // refused because a direct peer did
  // A rank's schedule is made when it is sent, so at most this many groups' schedules
  // are held at once (a group: agents that wait for each other in Prepare).
  const std::vector<int32_t> group_of = DirectGroups();
  GroupGate gate(std::max<int32_t>(1, static_cast<int32_t>(std::thread::hardware_concurrency())));
  phase_pool_.Run(
      [&](int32_t rank) {
        const bool cached = delivered_.count(rank) && delivered_.at(rank) == plan_->compiled.digest();
        for (bool send_schedule : {!cached, true}) {
          std::optional<v1::PrepareRequest> schedule;
          if (send_schedule) {
            gate.Enter(group_of[rank]);
            absl::StatusOr<v1::PrepareRequest> made = ScheduleRequest(plan_->compiled, rank);
            if (!made.ok()) {
              gate.Leave(group_of[rank]);
              refusals[rank] = absl::StrCat("rank ", rank, "'s schedule: ", made.status().message());
              return;
            }
            schedule = *std::move(made);
          }
          const absl::StatusOr<v1::PrepareResponse> response = links.at(rank)->Prepare(
              PrepareRequestFor(rank, std::move(schedule), sync_id, execute_deadline, &contacts.addresses),
              absl::Now() + options_.rpc_deadline);
          if (send_schedule) gate.Leave(group_of[rank]);
          if (!response.ok()) {
            refusals[rank] = absl::StrCat("rank ", rank, " did not answer Prepare: ", response.status().message());
            return;
          }
          if (response->schedule_missing()) continue;  // resend with the schedule
          if (!response->ok()) refusals[rank] = absl::StrCat("rank ", rank, " refused: ", response->refusal());
          peer_refused[rank] = response->peer_refused();
          return;
        }
      },
      CallerRank(links), SyncWaitPoll(contacts.host_copies));
  std::vector<std::string> refused;
  std::vector<std::string> followers;  // named only when no rank refused on its own
  for (int32_t rank = 0; rank < world; ++rank) {
    if (!refusals[rank].empty()) {
      (peer_refused[rank] ? followers : refused).push_back(refusals[rank]);
      delivered_.erase(rank);
    } else {
      delivered_[rank] = plan_->compiled.digest();
    }
  }
  if (refused.empty() && followers.empty()) return absl::OkStatus();
  if (refused.empty()) {
    refused = std::move(followers);
  } else if (!followers.empty()) {
    refused.push_back(absl::StrCat(followers.size(), " more ranks refused because a direct peer did"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("sync ", sync_id, " refused, no byte moved: ", absl::StrJoin(refused, "; ")));
}

std::vector<int32_t> SyncRunner::DirectGroups() const {
  const int32_t world = options_.epoch.world_size;
  std::vector<int32_t> group(world);
  std::iota(group.begin(), group.end(), 0);
  const auto root = [&group](int32_t r) {
    while (group[r] != r) r = group[r] = group[group[r]];
    return r;
  };
  for (int32_t rank = 0; rank < world; ++rank) {
    for (int32_t peer : paths_.DirectPeers(rank)) group[root(peer)] = root(rank);
  }
  for (int32_t rank = 0; rank < world; ++rank) group[rank] = root(rank);
  return group;
}

bool SyncRunner::OneCallReady(const AgentDirectory::Contacts& contacts) const {
  // One call needs the agreement in Execute. Between agents on different hosts without
  // a device collective it is a gRPC message between every pair, dearer than the
  // Prepare call it saves; one agent, agents whose transport agrees in one collective
  // (NCCL), and agents that all reach each other's signal boards (one host) get one call.
  if (ready_digest_.empty() || ready_digest_ != plan_->compiled.digest() || !CommunicatorValid()) return false;
  if (options_.epoch.world_size > 1 && !contacts.all_agree_fast && !paths_.AllOnSignalBoards()) return false;
  // A failed Execute may have written; a failed Prepare wrote nothing. An agent whose
  // link is down (killed between syncs) is met by Prepare, so its refusal leaves every
  // target valid.
  for (const auto& [rank, link] : contacts.links) {
    if (!link->Connected()) return false;
  }
  return true;
}

std::map<int32_t, v1::DeltaSpec> SyncRunner::DeltaSpecs() const {
  std::map<int32_t, v1::DeltaSpec> specs;
  if (options_.delta == DeltaMode::kOff || !plan_->compiled.planned.plan.quantizes.empty()) return specs;
  const std::vector<int32_t> nodes = directory_.NodeOfRank();
  std::set<int32_t> on_host;  // agents whose transport carries deltas
  for (const v1::JoinRequest& join : directory_.Joins()) {
    if (join.device() == "cpu") on_host.insert(join.rank());
  }
  const std::map<int32_t, std::string> by_own_word = directory_.TargetVersionsByOwnWord();
  const std::map<int32_t, std::string> versions = validity_.Versions(by_own_word);
  const std::map<int32_t, std::string> unversioned = validity_.Unversioned(by_own_word);
  for (int32_t rank : on_host) {
    v1::DeltaSpec& spec = specs[rank];
    for (const auto& [peer, word] : by_own_word) {
      if (peer == rank || on_host.count(peer) == 0) continue;
      if (options_.delta == DeltaMode::kAuto && nodes[peer] == nodes[rank]) {  // fast inside a node
        (*spec.mutable_full_peers())[peer] = "same_node";  // executor::kSameNodeWord: nothing kept for it
      } else if (const auto version = versions.find(peer); version != versions.end()) {
        (*spec.mutable_peer_versions())[peer] = version->second;
      } else {
        (*spec.mutable_full_peers())[peer] = unversioned.at(peer);
      }
    }
  }
  for (auto& [rank, spec] : specs) {
    for (const auto& [peer, version] : spec.peer_versions()) specs.at(peer).add_delta_senders(rank);
  }
  return specs;
}

absl::StatusOr<std::vector<v1::ExecuteResponse>> SyncRunner::ExecuteAll(const std::string& sync_id,
                                                                        absl::Duration timeout,
                                                                        const v1::SyncRequest& request, bool one_call,
                                                                        const AgentDirectory::Contacts& contacts) {
  const std::map<int32_t, std::shared_ptr<AgentLink>>& links = contacts.links;
  const int32_t world = options_.epoch.world_size;
  std::vector<absl::Status> results(world);
  std::vector<v1::ExecuteResponse> responses(world);
  // The first rank that fails makes every rank abort at once: nobody waits out its
  // deadline on a peer that is gone.
  std::once_flag aborting;
  const auto abort_all = [&](int32_t failed, const std::string& why) {
    std::call_once(aborting, [&] {
      v1::AbortRequest abort;
      abort.set_sync_id(sync_id);
      abort.set_reason(absl::StrCat("rank ", failed, ": ", why));
      const absl::Time deadline = absl::Now() + options_.rpc_deadline;
      std::vector<std::unique_ptr<StartedCall<v1::AbortResponse>>> aborts;
      for (int32_t rank = 0; rank < world; ++rank) aborts.push_back(links.at(rank)->StartAbort(abort, deadline));
      for (auto& call : aborts) call->Await().IgnoreError();  // the sync fails anyway
    });
  };
  std::vector<std::unique_ptr<StartedExecute>> calls(world);
  std::vector<absl::Time> called(world);
  const std::map<int32_t, v1::DeltaSpec> deltas = DeltaSpecs();
  const auto start = [&](int32_t rank) {
    v1::ExecuteRequest execute;
    execute.set_sync_id(sync_id);
    execute.set_digest(plan_->compiled.digest());
    execute.set_verify(request.verify());
    execute.set_links(request.links());
    if (const auto delta = deltas.find(rank); delta != deltas.end()) *execute.mutable_delta() = delta->second;
    if (one_call) *execute.mutable_prepare() = PrepareRequestFor(rank, std::nullopt, sync_id, timeout, nullptr);
    called[rank] = absl::Now();
    // The agent's own waits end at the timeout; this leaves it room to say so.
    calls[rank] = links.at(rank)->StartExecute(std::move(execute), called[rank] + timeout + options_.rpc_deadline);
  };
  // Sent from here, no agent hears of the sync only after a pool thread has woken.
  const bool sent_by_caller = world <= kExecutesSentByCaller;
  if (sent_by_caller) {
    for (int32_t rank = 0; rank < world; ++rank) start(rank);
  }
  phase_pool_.Run(
      [&](int32_t rank) {
        if (!sent_by_caller) start(rank);
        absl::StatusOr<v1::ExecuteResponse> answer = calls[rank]->Await();
        results[rank] = answer.status();
        if (answer.ok()) {
          answer->mutable_stats()->set_call_seconds(absl::ToDoubleSeconds(absl::Now() - called[rank]));
          responses[rank] = *std::move(answer);
        }
        if (!results[rank].ok()) abort_all(rank, std::string(results[rank].message()));
      },
      CallerRank(links), SyncWaitPoll(contacts.host_copies));
  std::vector<std::string> failures;
  bool written = false;  // some rank finished, or failed after it may have written
  for (int32_t rank = 0; rank < world; ++rank) {
    const absl::Status& status = results[rank];
    written = written || status.ok();
    if (status.ok()) continue;
    // A dead agent's call often ends with no message: its code says enough.
    written = written || !absl::IsFailedPrecondition(status);
    failures.push_back(absl::StrCat("rank ", rank, ": ", absl::StatusCodeToString(status.code()),
                                    status.message().empty() ? " (no answer)" : absl::StrCat(": ", status.message())));
  }
  if (failures.empty()) return responses;
  communicator_membership_version_ = -1;  // NCCL may have aborted it somewhere
  if (!written) {
    // Every rank stopped before writing (at the agreement, or each on its own).
    return absl::FailedPreconditionError(
        absl::StrCat("sync ", sync_id, " refused, no byte moved: ", absl::StrJoin(failures, "; ")));
  }
  validity_.PartlyWritten(plan_->target_ranks);
  delivered_.clear();
  return absl::UnavailableError(absl::StrCat(
      "sync ", sync_id, " failed; targets are invalid until the next sync succeeds: ", absl::StrJoin(failures, "; ")));
}

}  // namespace shardsync::coordinator
