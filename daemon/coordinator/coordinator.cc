#include "daemon/coordinator/coordinator.h"

#include <malloc.h>

#include <algorithm>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "daemon/common/schedule_codec.h"
#include "daemon/coordinator/layouts.h"
#include "planner/cost.h"
#include "planner/digest.h"
#include "planner/relay.h"
#include "spdlog/spdlog.h"

namespace shardsync::coordinator {
namespace {

std::string NewInstanceId() { return absl::StrCat(absl::ToUnixNanos(absl::Now())); }

// sync --verify: the checksums of every rank added up per (tensor, target rank); the
// number of pairs compared, or which differ.
absl::StatusOr<int32_t> CompareChecksums(const std::vector<v1::ExecuteResponse>& responses) {
  std::map<std::pair<std::string, int32_t>, std::pair<uint64_t, uint64_t>> sums;  // sources, targets
  for (const v1::ExecuteResponse& response : responses) {
    for (const v1::TensorChecksum& c : response.checksums()) {
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
    return absl::DataLossError(absl::StrCat("verify failed: the targets differ from their sources in ", differ.size(),
                                            " placement(s): ",
                                            absl::StrJoin(differ.begin(), differ.begin() + shown, "; "),
                                            differ.size() > shown ? "; ..." : ""));
  }
  return static_cast<int32_t>(sums.size());
}

}  // namespace

Coordinator::Coordinator(CoordinatorConfig config)
    : config_(config), instance_id_(NewInstanceId()), phase_pool_(config.world_size) {}

void Coordinator::SetLocalAgent(const std::string& incarnation, std::shared_ptr<AgentLink> link) {
  absl::MutexLock lock(&mu_);
  local_incarnation_ = incarnation;
  local_link_ = std::move(link);
}

std::map<int32_t, std::shared_ptr<AgentLink>> Coordinator::Links() const {
  absl::MutexLock lock(&mu_);
  std::map<int32_t, std::shared_ptr<AgentLink>> links;
  for (const auto& [rank, entry] : agents_) links[rank] = entry.link;
  return links;
}

std::map<int32_t, std::string> Coordinator::Addresses() const {
  absl::MutexLock lock(&mu_);
  std::map<int32_t, std::string> addresses;
  for (const auto& [rank, entry] : agents_) addresses[rank] = entry.join.address();
  return addresses;
}

std::vector<int32_t> Coordinator::NodeOfRank() const {
  std::map<std::string, int32_t> index;
  std::vector<int32_t> nodes(config_.world_size, 0);
  for (const auto& [rank, entry] : agents_) {
    const std::string& node = entry.join.node().empty() ? entry.join.host() : entry.join.node();
    if (rank < config_.world_size) nodes[rank] = index.emplace(node, static_cast<int32_t>(index.size())).first->second;
  }
  return nodes;
}

namespace {

constexpr size_t kMaxNameBytes = 1024;  // hosts, addresses, devices, nodes, incarnations, ids
// An agent that joined (its heartbeat) this recently is alive: it owns its rank.
constexpr absl::Duration kAgentLiveness = absl::Seconds(3);

absl::Status CheckRank(int32_t rank, int32_t world) {
  if (rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside a world of ", world));
  }
  return absl::OkStatus();
}

// A name the request must carry (`required`), at most kMaxNameBytes long.
absl::Status CheckName(const char* what, const std::string& value, bool required) {
  if (required && value.empty()) return absl::InvalidArgumentError(absl::StrCat("the request has no ", what));
  if (value.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the request's ", what, " is ", value.size(), " bytes; at most ",
                                                   kMaxNameBytes));
  }
  return absl::OkStatus();
}

absl::Status CheckJoin(const v1::JoinRequest& request, int32_t world) {
  SHARDSYNC_RETURN_IF_ERROR(CheckRank(request.rank(), world));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("address", request.address(), true));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("incarnation", request.incarnation(), true));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("host", request.host(), false));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("device", request.device(), false));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("device uuid", request.device_uuid(), false));
  return CheckName("node", request.node(), false);
}

absl::Status CheckPublish(const v1::PublishRequest& request, int32_t world) {
  SHARDSYNC_RETURN_IF_ERROR(CheckRank(request.rank(), world));
  SHARDSYNC_RETURN_IF_ERROR(CheckName("incarnation", request.incarnation(), true));
  for (const v1::PublishedLayout& layout : request.layouts()) {
    SHARDSYNC_RETURN_IF_ERROR(CheckName("client id", layout.client_id(), true));
    if (layout.role() != v1::SOURCE && layout.role() != v1::TARGET) {
      return absl::InvalidArgumentError(absl::StrCat("client '", layout.client_id(), "' has no role"));
    }
    for (const v1::BufferInfo& b : layout.buffers()) {
      SHARDSYNC_RETURN_IF_ERROR(CheckName("buffer name", b.name(), true));
      if (b.bytes() < 0) {
        return absl::InvalidArgumentError(absl::StrCat("buffer '", b.name(), "' of client '", layout.client_id(),
                                                       "' has ", b.bytes(), " bytes"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Duration SyncTimeout(int64_t requested_ms, absl::Duration configured) {
  return requested_ms > 0 ? std::min(absl::Milliseconds(requested_ms), configured) : configured;
}

absl::StatusOr<v1::JoinResponse> Coordinator::Join(const v1::JoinRequest& request) {
  SHARDSYNC_RETURN_IF_ERROR(CheckJoin(request, config_.world_size));
  absl::MutexLock lock(&mu_);
  AgentEntry& entry = agents_[request.rank()];
  const absl::Duration silent = absl::Now() - entry.last_seen;
  if (entry.link && entry.join.incarnation() != request.incarnation() && silent < kAgentLiveness) {
    return absl::AlreadyExistsError(absl::StrCat(
        "rank ", request.rank(), " belongs to a live agent (incarnation ", entry.join.incarnation(), " at ",
        entry.join.address(), ", seen ", absl::FormatDuration(silent), " ago); another may take it once that one has "
        "been silent for ", absl::FormatDuration(kAgentLiveness)));
  }
  if (entry.link && entry.join.incarnation() != request.incarnation()) {
    // A new agent process: whatever the old one published died with it.
    spdlog::info("rank {} restarted; its old layouts are dropped", request.rank());
    if (published_.erase(request.rank()) > 0) ++epoch_;
    synced_target_ranks_.erase(request.rank());
    invalid_target_ranks_.erase(request.rank());  // its targets are new: its own word counts
    communicator_valid_ = false;
  }
  if (!entry.link || entry.join.address() != request.address() || entry.join.incarnation() != request.incarnation()) {
    if (entry.link) spdlog::info("rank {} rejoined at {}", request.rank(), request.address());
    communicator_valid_ = false;  // a returning agent needs a new communicator
    const bool local = local_link_ && request.incarnation() == local_incarnation_;
    entry.link = local ? local_link_ : GrpcAgentLink(request.address(), config_.credentials);
    spdlog::info("rank {} joined from {} ({}{})", request.rank(), request.address(), request.device(),
                 local ? ", in this process" : "");
  }
  entry.join = request;
  entry.last_seen = absl::Now();
  v1::JoinResponse response;
  response.set_world_size(config_.world_size);
  response.set_instance_id(instance_id_);
  const auto publication = published_.find(request.rank());
  response.set_published(publication != published_.end() &&
                         publication->second.incarnation() == request.incarnation());
  return response;
}

absl::StatusOr<v1::PublishResponse> Coordinator::Publish(const v1::PublishRequest& request) {
  SHARDSYNC_RETURN_IF_ERROR(CheckPublish(request, config_.world_size));
  absl::ReleasableMutexLock lock(&mu_);
  const auto agent = agents_.find(request.rank());
  if (agent == agents_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", request.rank(), " published before it joined"));
  }
  if (agent->second.join.incarnation() != request.incarnation()) {
    return absl::PermissionDeniedError(absl::StrCat("rank ", request.rank(), " belongs to incarnation ",
                                                    agent->second.join.incarnation(), ", not to ",
                                                    request.incarnation(), ", the publisher"));
  }
  // A fresh message, not an assignment: assigning keeps the old one's cleared repeated
  // fields allocated, and a publication can hold 100k tensors.
  published_.insert_or_assign(request.rank(), v1::PublishRequest(request));
  agent->second.join.set_targets_valid(request.targets_valid());  // its word, newer than its last Join
  synced_target_ranks_.erase(request.rank());
  ++epoch_;
  spdlog::info("rank {} published {} layouts; layout epoch {}", request.rank(), request.layouts_size(), epoch_);
  v1::PublishResponse response;
  response.set_layout_epoch(epoch_);
  lock.Release();
  // A running sync keeps its plan; it releases the stale ones when it ends.
  if (sync_mu_.TryLock()) {
    ReleaseStalePlans();
    sync_mu_.Unlock();
  }
  return response;
}

void Coordinator::ReleaseStalePlans() {
  {
    absl::MutexLock lock(&mu_);
    if (plans_.empty() || plans_.begin()->second.epoch == epoch_) return;
  }
  plans_.clear();
  plan_ = nullptr;
  malloc_trim(0);  // give the freed plans back to the system, not only to malloc
}

absl::StatusOr<std::vector<int32_t>> Coordinator::SelectTargetRanks(
    const google::protobuf::RepeatedField<int32_t>& requested) {
  std::set<int32_t> unique(requested.begin(), requested.end());
  if (unique.empty()) return std::vector<int32_t>();
  std::vector<int32_t> holding;
  {
    absl::MutexLock lock(&mu_);
    holding = TargetRanks(published_);
  }
  for (int32_t rank : unique) {
    if (rank < 0 || rank >= config_.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("target rank ", rank, " is outside a world of ", config_.world_size));
    }
    if (!std::binary_search(holding.begin(), holding.end(), rank)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "target rank ", rank, " holds no target to write (targets are registered on ",
          holding.empty() ? "no rank" : "rank " + absl::StrJoin(holding, ", rank "), ")"));
    }
  }
  return std::vector<int32_t>(unique.begin(), unique.end());
}

absl::StatusOr<bool> Coordinator::EnsurePlan(const std::vector<int32_t>& target_ranks) {
  std::map<int32_t, v1::PublishRequest> published;
  int64_t epoch;
  std::vector<int32_t> nodes;
  {
    absl::MutexLock lock(&mu_);
    epoch = epoch_;
    nodes = NodeOfRank();
    // A new epoch, or an agent that came back on another node: plan again.
    if (!plans_.empty() && (plans_.begin()->second.epoch != epoch || plans_.begin()->second.plan.node_of_rank != nodes)) {
      plans_.clear();
      plan_ = nullptr;
    }
    if (auto cached = plans_.find(target_ranks); cached != plans_.end()) {
      plan_ = &cached->second;
      return false;
    }
    published = published_;
  }
  const absl::Time start = absl::Now();
  SHARDSYNC_RETURN_IF_ERROR(CheckSourceOwners(published, config_.shared_source_uids));
  spec::BufferIds ids;
  auto input = CollectPlanInput(published, ids, target_ranks);
  if (!input.ok()) return input.status();
  if (input->tensors.empty()) return absl::FailedPreconditionError("no target tensor is registered: nothing to sync");
  for (const planner::Buffer& b : input->buffers) {
    if (b.holder.rank >= config_.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", b.holder.rank, " is outside a world of ", config_.world_size));
    }
  }
  input->node_of_rank = nodes;
  std::pair<double, double> floors{0, 0};
  auto plan = planner::MakePlanWithRelay(*input, *planner::LocalFirstLeastLoaded(), config_.relay, config_.bandwidths,
                                         &floors);
  if (!plan.ok()) {
    if (auto tensor = plan.status().GetPayload(planner::kUncoveredTensorPayload)) {
      return absl::Status(plan.status().code(),
                          absl::StrCat(plan.status().message(), MissingSourceHint(published, std::string(*tensor))));
    }
    return plan.status();
  }
  plan->num_ranks = config_.world_size;  // every agent gets a schedule, empty or not
  auto schedules = planner::MakeSchedules(*plan, config_.staging_bytes);
  if (!schedules.ok()) return schedules.status();
  CachedPlan cache;
  cache.epoch = epoch;
  cache.target_ranks = target_ranks.empty() ? TargetRanks(published) : target_ranks;
  cache.partial = !target_ranks.empty();
  cache.digest = planner::PlanDigest(*plan, config_.staging_bytes);
  const std::vector<v1::PrepareRequest*> requests = daemon::EncodeSchedules(*plan, *schedules, ids.names(), *cache.arena);
  cache.requests.assign(requests.begin(), requests.end());
  cache.plan = *std::move(plan);
  cache.schedules = *std::move(schedules);
  cache.floors = floors;
  for (const auto& stage : planner::StageBytes(cache.plan)) {
    for (const planner::RankStats& r : stage) cache.network_bytes += r.network_sent_bytes;
  }
  cache.plan_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  spdlog::info("planned epoch {}{}: {} tensors, {} segments, {} stage(s), digest {} in {:.2f} ms{}", epoch,
               target_ranks.empty() ? "" : absl::StrCat(" for the targets of rank ", absl::StrJoin(target_ranks, ", rank ")),
               input->tensors.size(), cache.plan.segments.size(), cache.plan.stages, cache.digest,
               cache.plan_seconds * 1e3,
               floors.first > 0 ? absl::StrFormat(" (floor %.3f ms direct, %.3f ms relayed)", floors.first * 1e3,
                                                  floors.second * 1e3)
                                : "");
  // Keep the full plan and this one: a refill is rare, and a plan can be large.
  for (auto it = plans_.begin(); it != plans_.end();) it = it->first.empty() ? std::next(it) : plans_.erase(it);
  plan_ = &(plans_[target_ranks] = std::move(cache));
  delivered_.clear();
  ready_digest_.clear();
  return true;
}

absl::StatusOr<v1::SyncResponse> Coordinator::Sync(const v1::SyncRequest& request) {
  absl::MutexLock sync_lock(&sync_mu_);
  const absl::Time start = absl::Now();
  const std::string sync_id = absl::StrCat("sync-", instance_id_.substr(instance_id_.size() - 6), "-", ++syncs_);
  const absl::Duration timeout = SyncTimeout(request.timeout_ms(), config_.sync_timeout);
  {
    absl::MutexLock lock(&mu_);
    ++counters_.started;
    running_sync_id_ = sync_id;
  }
  const auto finish = [&](absl::Status status) -> absl::Status {
    {
      absl::MutexLock lock(&mu_);
      ++(status.ok() ? counters_.succeeded : counters_.failed);
      running_sync_id_.clear();
      if (status.ok()) durations_.Observe(absl::ToDoubleSeconds(absl::Now() - start));
      last_sync_id_ = sync_id;
      last_sync_ok_ = status.ok();
      last_sync_error_ = std::string(status.message());
      if (!status.ok()) spdlog::warn("{} failed: {}", sync_id, last_sync_error_);
    }
    ReleaseStalePlans();  // layouts published while it ran
    return status;
  };
  std::vector<int32_t> missing;
  {
    absl::MutexLock lock(&mu_);
    for (int32_t r = 0; r < config_.world_size; ++r) {
      if (!agents_.count(r)) missing.push_back(r);
    }
  }
  if (!missing.empty()) {
    return finish(absl::FailedPreconditionError(
        absl::StrCat("rank ", absl::StrJoin(missing, ", rank "), " has not joined (world of ", config_.world_size, ")")));
  }
  const absl::StatusOr<std::vector<int32_t>> target_ranks = SelectTargetRanks(request.target_ranks());
  if (!target_ranks.ok()) {
    return finish(absl::InvalidArgumentError(
        absl::StrCat("sync ", sync_id, " refused, no byte moved: ", target_ranks.status().message())));
  }
  const absl::StatusOr<bool> planned = EnsurePlan(*target_ranks);
  if (!planned.ok()) {
    return finish(absl::FailedPreconditionError(
        absl::StrCat("sync ", sync_id, " refused, no byte moved: ", planned.status().message())));
  }
  const absl::Time prepare_start = absl::Now();
  const bool one_call = OneCallReady();
  if (!one_call) {
    if (auto status = PrepareAll(sync_id, timeout); !status.ok()) return finish(status);
  }
  ready_digest_.clear();  // until this sync succeeds
  const absl::Time execute_start = absl::Now();
  absl::StatusOr<std::vector<v1::ExecuteResponse>> responses = ExecuteAll(sync_id, timeout, request.verify(), one_call);
  if (!responses.ok()) return finish(responses.status());
  const absl::Time executed = absl::Now();
  v1::SyncResponse response;
  if (request.verify()) {
    absl::StatusOr<int32_t> compared = CompareChecksums(*responses);
    if (!compared.ok()) {
      {
        absl::MutexLock lock(&mu_);
        invalid_target_ranks_.insert(plan_->target_ranks.begin(), plan_->target_ranks.end());
        synced_target_ranks_.insert(plan_->target_ranks.begin(), plan_->target_ranks.end());
      }
      return finish(absl::DataLossError(absl::StrCat("sync ", sync_id, " ", compared.status().message())));
    }
    response.set_verified_placements(*compared);
  }
  {
    absl::MutexLock lock(&mu_);
    // Every target there is now was written (a rank that left holds none to be invalid).
    if (!plan_->partial) invalid_target_ranks_.clear();
    for (int32_t rank : plan_->target_ranks) invalid_target_ranks_.erase(rank);
    synced_target_ranks_.insert(plan_->target_ranks.begin(), plan_->target_ranks.end());
  }
  ready_digest_ = plan_->digest;
  response.set_one_call(one_call);
  response.set_sync_id(sync_id);
  response.set_layout_epoch(plan_->epoch);
  response.set_digest(plan_->digest);
  response.set_plan_seconds(*planned ? plan_->plan_seconds : 0);
  response.set_stages(plan_->plan.stages);
  response.set_network_bytes(plan_->network_bytes);
  response.mutable_target_ranks()->Add(plan_->target_ranks.begin(), plan_->target_ranks.end());
  if (!one_call) response.set_prepare_seconds(absl::ToDoubleSeconds(execute_start - prepare_start));
  response.set_execute_seconds(absl::ToDoubleSeconds(executed - execute_start));
  for (v1::ExecuteResponse& r : *responses) *response.add_ranks() = r.stats();
  response.set_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  {
    absl::MutexLock lock(&mu_);
    for (const v1::RankStats& r : response.ranks()) {
      counters_.sent += r.sent_bytes();
      counters_.received += r.received_bytes();
      counters_.local += r.local_bytes();
    }
  }
  finish(absl::OkStatus()).IgnoreError();
  return response;
}

absl::StatusOr<v1::ExplainResponse> Coordinator::Explain(const v1::ExplainRequest& request) {
  absl::MutexLock sync_lock(&sync_mu_);
  const absl::StatusOr<std::vector<int32_t>> target_ranks = SelectTargetRanks(request.target_ranks());
  if (!target_ranks.ok()) return target_ranks.status();
  if (auto planned = EnsurePlan(*target_ranks); !planned.ok()) return planned.status();
  const CachedPlan& cached = *plan_;
  const planner::PlanStats stats = planner::ComputeStats(cached.plan, cached.schedules);
  const auto speed = [](double gbps, double fallback) { return gbps > 0 ? gbps * 1e9 : fallback; };
  const planner::Bandwidths bandwidths{speed(request.link_gbps(), config_.bandwidths.link_bytes_per_s),
                                       speed(request.memory_gbps(), config_.bandwidths.memory_bytes_per_s),
                                       speed(request.network_gbps(), config_.bandwidths.network_bytes_per_s)};
  v1::ExplainResponse response;
  response.set_layout_epoch(cached.epoch);
  response.set_digest(cached.digest);
  response.set_tensors(static_cast<int32_t>(cached.plan.tensor_names.size()));
  response.set_segments(stats.segments);
  response.set_chunks(stats.chunks);
  response.set_rounds(stats.rounds);
  response.set_floor_seconds(planner::CostFloorSeconds(stats, bandwidths));
  response.set_stages(cached.plan.stages);
  response.set_network_bytes(stats.total_network_bytes);
  response.set_relayed_bytes(stats.total_relayed_bytes);
  response.set_direct_floor_seconds(cached.floors.first);
  response.set_relayed_floor_seconds(cached.floors.second);
  response.set_link_gbps(bandwidths.link_bytes_per_s / 1e9);
  response.set_memory_gbps(bandwidths.memory_bytes_per_s / 1e9);
  response.set_network_gbps(bandwidths.network_bytes_per_s / 1e9);
  for (size_t r = 0; r < stats.ranks.size(); ++r) {
    v1::RankStats* rank = response.add_ranks();
    rank->set_rank(static_cast<int32_t>(r));
    rank->set_rounds(stats.ranks[r].rounds);
    rank->set_chunks(stats.ranks[r].chunks);
    rank->set_sent_bytes(stats.ranks[r].sent_bytes);
    rank->set_received_bytes(stats.ranks[r].received_bytes);
    rank->set_local_bytes(stats.ranks[r].local_bytes);
    rank->set_fill_bytes(stats.ranks[r].fill_bytes);
    rank->set_network_sent_bytes(stats.ranks[r].network_sent_bytes);
    rank->set_network_received_bytes(stats.ranks[r].network_received_bytes);
    rank->set_relayed_bytes(stats.ranks[r].relayed_bytes);
  }
  for (const auto& [link, bytes] : stats.link_bytes) {
    v1::LinkBytes* out = response.add_links();
    out->set_from_rank(link.first);
    out->set_to_rank(link.second);
    out->set_bytes(bytes);
  }
  return response;
}

v1::CoordinatorStatus Coordinator::Status() const {
  v1::CoordinatorStatus status;
  status.set_sync_timeout_ms(absl::ToInt64Milliseconds(config_.sync_timeout));
  // While a sync runs, ask every agent how far it is (briefly: a status must not hang).
  std::map<int32_t, std::shared_ptr<AgentLink>> links;
  {
    absl::MutexLock lock(&mu_);
    if (!running_sync_id_.empty()) status.set_running_sync_id(running_sync_id_);
  }
  if (!status.running_sync_id().empty()) links = Links();
  if (!links.empty()) {
    std::vector<v1::RankProgress> progress(links.size());
    std::vector<int32_t> ranks;
    for (const auto& [rank, link] : links) ranks.push_back(rank);
    ForEachRank(static_cast<int32_t>(ranks.size()), [&](int32_t i) {
      auto answer = links.at(ranks[i])->Progress(absl::Now() + absl::Milliseconds(500));
      if (answer.ok()) progress[i] = *std::move(answer);
      progress[i].set_rank(ranks[i]);
    });
    for (v1::RankProgress& p : progress) *status.add_progress() = std::move(p);
  }
  absl::MutexLock lock(&mu_);
  status.set_world_size(config_.world_size);
  for (const auto& [rank, entry] : agents_) {
    v1::AgentInfo* info = status.add_agents();
    info->set_rank(rank);
    info->set_host(entry.join.host());
    info->set_node(entry.join.node().empty() ? entry.join.host() : entry.join.node());
    info->set_address(entry.join.address());
    info->set_device(entry.join.device());
    info->set_reachable(absl::Now() - entry.last_seen < kAgentLiveness);
    info->set_seconds_since_seen(absl::ToDoubleSeconds(absl::Now() - entry.last_seen));
    auto published = published_.find(rank);
    info->set_clients(published == published_.end() ? 0 : published->second.layouts_size());
  }
  status.set_layout_epoch(epoch_);
  status.set_last_sync_id(last_sync_id_);
  status.set_last_sync_ok(last_sync_ok_);
  status.set_last_sync_error(last_sync_error_);
  const std::set<int32_t> invalid = InvalidTargetRanks();
  status.set_targets_valid(invalid.empty());
  status.mutable_invalid_target_ranks()->Add(invalid.begin(), invalid.end());
  return status;
}

std::set<int32_t> Coordinator::InvalidTargetRanks() const {
  std::set<int32_t> invalid = invalid_target_ranks_;
  for (int32_t rank : TargetRanks(published_)) {
    const auto agent = agents_.find(rank);
    if (agent != agents_.end() && !agent->second.join.targets_valid() && synced_target_ranks_.count(rank) == 0) {
      invalid.insert(rank);
    }
  }
  return invalid;
}

std::string Coordinator::Metrics() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  AppendMetric(&out, "shardsync_syncs_started_total", "counter", "Syncs asked for.", counters_.started);
  AppendMetric(&out, "shardsync_syncs_succeeded_total", "counter", "Syncs every agent finished.", counters_.succeeded);
  AppendMetric(&out, "shardsync_syncs_failed_total", "counter", "Syncs refused or failed.", counters_.failed);
  AppendMetric(&out, "shardsync_sent_bytes_total", "counter", "Bytes sent between agents by successful syncs.",
               counters_.sent);
  AppendMetric(&out, "shardsync_received_bytes_total", "counter", "Bytes received by agents in successful syncs.",
               counters_.received);
  AppendMetric(&out, "shardsync_local_bytes_total", "counter", "Bytes copied on one agent in successful syncs.",
               counters_.local);
  durations_.Append(&out, "shardsync_sync_duration_seconds", "Wall time of successful syncs.");
  AppendMetric(&out, "shardsync_last_sync_version", "gauge", "Number of the last successful sync (0: none).",
               counters_.succeeded);
  const std::set<int32_t> invalid = InvalidTargetRanks();
  AppendMetric(&out, "shardsync_targets_valid", "gauge",
               "1 unless some rank's targets do not hold a completed sync's bytes.", invalid.empty());
  AppendMetric(&out, "shardsync_invalid_target_ranks", "gauge", "Ranks whose targets are invalid.",
               static_cast<double>(invalid.size()));
  AppendMetric(&out, "shardsync_layout_epoch", "gauge", "Layout epoch (changes with every publication).", epoch_);
  AppendMetric(&out, "shardsync_agents", "gauge", "Agents joined.", static_cast<double>(agents_.size()));
  int64_t buffers = 0, bytes = 0;
  for (const auto& [rank, publication] : published_) {
    for (const v1::PublishedLayout& layout : publication.layouts()) {
      buffers += layout.buffers_size();
      for (const v1::BufferInfo& b : layout.buffers()) bytes += b.bytes();
    }
  }
  AppendMetric(&out, "shardsync_registered_buffers", "gauge", "Buffers registered on all agents.", buffers);
  AppendMetric(&out, "shardsync_registered_bytes", "gauge", "Bytes of the buffers registered on all agents.", bytes);
  return out;
}

}  // namespace shardsync::coordinator
