#include "daemon/agent/agent.h"

#include <unistd.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/metrics_http.h"
#include "common/status_macros.h"
#include "executor/buffer_check.h"
#include "executor/round_engine.h"
#include "executor/verify.h"
#include "planner/quantize.h"
#include "planner/schedule.h"
#include "spdlog/spdlog.h"

namespace shardsync::agent {
namespace {

// The most milliseconds one sync may wait: longer deadlines are a malformed request.
constexpr int64_t kMaxDeadlineMs = int64_t{24} * 3600 * 1000;

// The communicator a Prepare describes holds `rank`, and every peer it names is in it.
absl::Status CheckPeers(const v1::PrepareRequest& request, int32_t rank) {
  if (request.world_size() <= rank) {
    return absl::InvalidArgumentError(absl::StrCat("world of ", request.world_size(), " ranks lacks this rank ", rank));
  }
  if (request.deadline_ms() <= 0 || request.deadline_ms() > kMaxDeadlineMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("deadline of ", request.deadline_ms(), " ms is outside (0, ", kMaxDeadlineMs, "]"));
  }
  const std::pair<const char*, const google::protobuf::Map<int32_t, std::string>*> named[] = {
      {"an address", &request.peer_addresses()}, {"a signal board", &request.peer_signal_boards()}};
  for (const auto& [what, names] : named) {
    for (const auto& [peer, name] : *names) {
      if (peer < 0 || peer >= request.world_size() || peer == rank) {
        return absl::InvalidArgumentError(absl::StrCat(what, " is given for rank ", peer, " in a world of ",
                                                       request.world_size(), " where this is rank ", rank));
      }
    }
  }
  return absl::OkStatus();
}

// Every stream of `schedule` is with another rank of the world.
absl::Status CheckStreams(const planner::Schedule& schedule, int32_t world_size) {
  for (const planner::Stage& stage : schedule.stages) {
    for (const auto* streams : {&stage.sends, &stage.receives}) {
      for (const planner::PeerStream& stream : *streams) {
        if (stream.peer < 0 || stream.peer >= world_size || stream.peer == schedule.rank) {
          return absl::InvalidArgumentError(
              absl::StrCat("the schedule has a stream with rank ", stream.peer, " in a world of ", world_size));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

Agent::Agent(AgentConfig config, Registry& registry, CoordinatorLink& link, executor::Device& device,
             executor::Transport& transport, executor::Mailbox& mailbox, DirectPath direct)
    : config_(std::move(config)),
      registry_(registry),
      link_(link),
      device_(device),
      transport_(transport),
      mailbox_(mailbox),
      direct_(direct) {}

absl::Status Agent::Admit(const v1::RegisterRequest& request, const Peer& peer) {
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
  SHARDSYNC_RETURN_IF_ERROR(registry_.Add(request, peer, std::move(ready_event)));
  if (request.role() == v1::TARGET) {  // new memory: it holds no sync's bytes yet
    absl::MutexLock lock(&mu_);
    target_valid_ = false;
    link_.SetTargetsValid(false);
  }
  link_.Nudge();
  spdlog::info("client '{}' (pid {}, uid {}) registered {} buffers and {} tensors", request.client_id(), peer.pid,
               peer.uid, request.buffers_size(), request.tensors_size());
  return absl::OkStatus();
}

void Agent::Withdraw(const std::string& client_id) {
  registry_.Remove(client_id);
  link_.Nudge();
  spdlog::info("client '{}' went away; its registrations are dropped", client_id);
}

grpc::Status Agent::Register(grpc::ServerContext* context, const v1::RegisterRequest& request,
                             grpc::ServerWriter<v1::RegisterEvent>* writer, const Peer& peer) {
  if (const absl::Status admitted = Admit(request, peer); !admitted.ok()) {
    spdlog::warn("refused registration of '{}': {}", request.client_id(), std::string(admitted.message()));
    return ToGrpcStatus(admitted);
  }
  v1::RegisterEvent event;
  event.set_rank(config_.rank);
  event.set_layout_epoch(link_.WaitPublished(registry_.version(), absl::Now() + config_.rpc_deadline));
  writer->Write(event);
  // Held until the client goes away (cancel, exit) or the agent stops.
  while (!context->IsCancelled() && !shutting_down_) absl::SleepFor(absl::Milliseconds(20));
  Withdraw(request.client_id());
  return grpc::Status::OK;
}

v1::AgentStatus Agent::Status() const {
  v1::AgentStatus status;
  status.set_rank(config_.rank);
  status.set_device(config_.device);
  status.set_joined(link_.joined());
  for (v1::ClientInfo& client : registry_.Clients()) *status.add_clients() = std::move(client);
  absl::MutexLock lock(&mu_);
  status.set_last_sync_id(last_sync_id_);
  status.set_target_valid(target_valid_);
  return status;
}

v1::RankProgress Agent::Progress() const {
  v1::RankProgress progress;
  progress.set_rank(config_.rank);
  {
    absl::MutexLock lock(&mu_);
    progress.set_sync_id(running_sync_id_);
  }
  progress.set_bytes_done(progress_.bytes_done);
  progress.set_bytes_total(progress_.bytes_total);
  progress.set_rounds_done(progress_.rounds_done);
  progress.set_rounds_total(progress_.rounds_total);
  return progress;
}

std::string Agent::Metrics() const {
  int64_t buffers = 0, bytes = 0;
  const std::vector<v1::ClientInfo> clients = registry_.Clients();
  for (const v1::ClientInfo& c : clients) {
    buffers += c.buffers();
    bytes += c.bytes();
  }
  std::string out;
  AppendMetric(&out, "shardsync_agent_clients", "gauge", "Clients registered with this agent.",
               static_cast<double>(clients.size()));
  AppendMetric(&out, "shardsync_agent_registered_buffers", "gauge", "Buffers registered with this agent.", buffers);
  AppendMetric(&out, "shardsync_agent_registered_bytes", "gauge", "Bytes of the buffers registered here.", bytes);
  absl::MutexLock lock(&mu_);
  AppendMetric(&out, "shardsync_agent_syncs_executed_total", "counter", "Syncs this rank finished.", executed_);
  AppendMetric(&out, "shardsync_agent_syncs_failed_total", "counter", "Syncs that failed on this rank.", failed_);
  AppendMetric(&out, "shardsync_agent_sent_bytes_total", "counter", "Bytes this rank sent.", moved_.sent_bytes);
  AppendMetric(&out, "shardsync_agent_received_bytes_total", "counter", "Bytes this rank received.",
               moved_.received_bytes);
  AppendMetric(&out, "shardsync_agent_local_bytes_total", "counter", "Bytes this rank copied locally.",
               moved_.local_bytes);
  AppendMetric(&out, "shardsync_agent_target_valid", "gauge",
               "1 unless a sync failed part way through this rank's targets.", target_valid_);
  return out;
}

absl::Status Agent::Check(const daemon::LocalSchedule& local,
                          std::vector<std::shared_ptr<const BufferEntry>> entries) const {
  // Each buffer looked up once: a schedule has thousands of segments and a few buffers.
  entries.resize(local.buffer_names.size());
  std::vector<int64_t> sizes(local.buffer_names.size(), 0);
  const auto check = [&](int32_t id, v1::Role role, int32_t tensor_index) -> absl::Status {
    const std::string& name = local.buffer_names.at(id);
    const std::string& tensor = local.plan.tensor_names[tensor_index];
    if (!entries[id]) {
      entries[id] = registry_.Find(name);
      if (entries[id]) {  // checked once per Check; Execute checks the mappings it holds itself
        if (const absl::Status intact = entries[id]->memory->CheckIntact(); !intact.ok()) {
          return absl::FailedPreconditionError(
              absl::StrCat("tensor '", tensor, "': buffer '", name, "': ", intact.message()));
        }
      }
    }
    const std::shared_ptr<const BufferEntry>& entry = entries[id];
    if (!entry) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor '", tensor, "': buffer '", name, "' is not registered"));
    }
    if (entry->role != role) {
      return absl::FailedPreconditionError(absl::StrCat("tensor '", tensor, "': buffer '", name, "' is registered as ",
                                                        v1::Role_Name(entry->role), ", the plan uses it as ",
                                                        v1::Role_Name(role)));
    }
    sizes[id] = entry->memory->bytes();
    return absl::OkStatus();
  };
  for (const planner::Segment& s : local.plan.segments) {
    // A relay stage reads a target of this rank (that the stage before wrote).
    if (s.src.rank == config_.rank) {
      SHARDSYNC_RETURN_IF_ERROR(
          check(s.src.buffer, planner::IsRelayStage(s.stage) ? v1::TARGET : v1::SOURCE, s.tensor));
    }
    if (s.dst.rank == config_.rank) SHARDSYNC_RETURN_IF_ERROR(check(s.dst.buffer, v1::TARGET, s.tensor));
  }
  for (const planner::FillOp& f : local.plan.fills) {
    SHARDSYNC_RETURN_IF_ERROR(check(f.fill.holder.buffer, v1::TARGET, f.tensor));
  }
  for (const planner::QuantizeOp& q : local.plan.quantizes) {
    if (local.buffer_names.at(q.scratch.buffer) != planner::kScratchBufferName) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", local.plan.tensor_names[q.tensor],
                                                     "': a quantize reads buffer '",
                                                     local.buffer_names[q.scratch.buffer], "' as its scratch"));
    }
    for (int32_t id : {q.scratch.buffer, q.target.buffer, q.scale.buffer}) {
      SHARDSYNC_RETURN_IF_ERROR(check(id, v1::TARGET, q.tensor));
    }
  }
  return executor::CheckRegionsFit(local.plan, config_.rank, sizes, local.buffer_names);
}

executor::PeerSetup Agent::PeersOf(const v1::PrepareRequest& request) const {
  executor::PeerSetup peers;
  peers.rank = config_.rank;
  peers.world_size = request.world_size();
  peers.addresses.insert(request.peer_addresses().begin(), request.peer_addresses().end());
  peers.boards.insert(request.peer_signal_boards().begin(), request.peer_signal_boards().end());
  peers.communicator_id = request.communicator_id();
  peers.generation = request.communicator_generation();
  return peers;
}

absl::Status Agent::PrepareLocked(const v1::PrepareRequest& request, bool map_direct, bool* schedule_missing) {
  *schedule_missing = false;
  if (request.staging_bytes() <= 0 || request.staging_bytes() > config_.max_staging_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("staging budget of ", request.staging_bytes(),
                                                   " bytes is outside (0, ", config_.max_staging_bytes, "]"));
  }
  SHARDSYNC_RETURN_IF_ERROR(CheckPeers(request, config_.rank));
  if (request.schedule_cached()) {
    auto it = prepared_.find(request.digest());
    if (it == prepared_.end()) {
      *schedule_missing = true;
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", config_.rank, " does not hold the schedule of plan ", request.digest()));
    }
    Prepared& prepared = it->second;
    SHARDSYNC_RETURN_IF_ERROR(CheckStreams(prepared.local->schedule, request.world_size()));
    // A peer's ask for another plan's scratch may have replaced this plan's.
    SHARDSYNC_RETURN_IF_ERROR(registry_.ProvideScratch(prepared.local->scratch_bytes));
    prepared.sync_id = request.sync_id();
    prepared.deadline = absl::Milliseconds(request.deadline_ms());
    prepared.peers = PeersOf(request);
    prepared.agree_in_execute = request.agree_in_execute();
    std::set<int32_t> direct(request.direct_peers().begin(), request.direct_peers().end());
    const bool mapped =
        prepared.direct_mapped && !map_direct &&
        std::equal(direct.begin(), direct.end(), prepared.direct_peers.begin(), prepared.direct_peers.end());
    if (!mapped) prepared.direct_mapped = false;
    // Buffers, roles and bounds change only with the registry: checked once per version.
    const int64_t version = registry_.version();
    if (prepared.checked_version != version) {
      SHARDSYNC_RETURN_IF_ERROR(Check(*prepared.local));
      prepared.checked_version = version;
      return mapped ? absl::OkStatus() : PrepareDirect(request, prepared);
    }
    // Host memory can shrink under its registration without the registry knowing.
    for (const std::string& name : prepared.local->buffer_names) {
      const std::shared_ptr<const BufferEntry> entry = registry_.Find(name);
      if (!entry) continue;  // unused here: Check would have refused a missing one
      if (const absl::Status intact = entry->memory->CheckIntact(); !intact.ok()) {
        return absl::FailedPreconditionError(absl::StrCat("buffer '", name, "': ", intact.message()));
      }
    }
    return mapped ? absl::OkStatus() : PrepareDirect(request, prepared);
  }
  const int64_t version = registry_.version();
  SHARDSYNC_ASSIGN_OR_RETURN(auto local, daemon::DecodeSchedule(request, config_.rank));
  SHARDSYNC_RETURN_IF_ERROR(planner::CheckChunks(local.plan, local.schedule, request.staging_bytes()));
  SHARDSYNC_RETURN_IF_ERROR(CheckStreams(local.schedule, request.world_size()));
  SHARDSYNC_RETURN_IF_ERROR(registry_.ProvideScratch(local.scratch_bytes));
  SHARDSYNC_RETURN_IF_ERROR(Check(local));
  Prepared prepared{std::make_shared<const daemon::LocalSchedule>(std::move(local)),
                    request.sync_id(),
                    request.staging_bytes(),
                    absl::Milliseconds(request.deadline_ms()),
                    PeersOf(request),
                    version};
  prepared.agree_in_execute = request.agree_in_execute();
  SHARDSYNC_RETURN_IF_ERROR(PrepareDirect(request, prepared));
  prepared_.clear();  // one plan per epoch: the previous one is stale
  prepared_[request.digest()] = std::move(prepared);
  return absl::OkStatus();
}

absl::Status Agent::PrepareDirect(const v1::PrepareRequest& request, Prepared& prepared) const {
  const daemon::LocalSchedule& local = *prepared.local;
  const std::set<int32_t> unique(request.direct_peers().begin(), request.direct_peers().end());
  std::vector<int32_t> direct(unique.begin(), unique.end());
  for (int32_t peer : direct) {
    if (peer < 0 || peer >= request.world_size() || peer == config_.rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("direct peer ", peer, " is not another rank of a world of ", request.world_size()));
    }
  }
  if (!direct.empty() && (direct_.signals == nullptr || direct_.targets == nullptr)) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", config_.rank, " has no direct path"));
  }
  const bool communicator = !transport_.device_memory() || !request.communicator_id().empty();
  const auto is_direct = [&](int32_t peer) { return std::binary_search(direct.begin(), direct.end(), peer); };
  const int32_t own = static_cast<int32_t>(local.buffer_names.size());
  std::map<int32_t, std::vector<int32_t>> written;  // direct peer -> its buffers this rank writes (index - own)
  for (const planner::Stage& stage : local.schedule.stages) {
    for (const auto* streams : {&stage.sends, &stage.receives}) {
      for (const planner::PeerStream& stream : *streams) {
        if (!is_direct(stream.peer) && !communicator) {
          return absl::FailedPreconditionError(absl::StrCat(
              "rank ", stream.peer, " is not on the direct path and this sync builds no communicator for it"));
        }
      }
    }
    for (const planner::PeerStream& stream : stage.sends) {
      if (!is_direct(stream.peer)) continue;
      std::vector<int32_t>& buffers = written[stream.peer];
      for (int32_t index : stream.segments) {
        const planner::Segment& s = local.plan.segments[index];
        if (s.dst.buffer < own) {
          return absl::InvalidArgumentError(absl::StrCat("tensor '", local.plan.tensor_names[s.tensor],
                                                         "': the schedule names no buffer of rank ", stream.peer,
                                                         " for the direct path to write"));
        }
        if (std::find(buffers.begin(), buffers.end(), s.dst.buffer - own) == buffers.end()) {
          buffers.push_back(s.dst.buffer - own);
        }
      }
    }
  }
  prepared.peer_memory.assign(local.peer_buffers.size(), nullptr);
  prepared.direct_peers = direct;
  prepared.direct_mapped = direct.empty();
  if (direct.empty()) return absl::OkStatus();  // nothing to map or bound
  std::vector<int64_t> sizes(local.buffer_count(), 0);
  std::vector<std::string> names = local.buffer_names;
  for (const daemon::PeerBufferName& peer : local.peer_buffers) names.push_back(peer.name);
  for (const auto& [peer, buffers] : written) {
    const auto address = request.peer_addresses().find(peer);
    if (address == request.peer_addresses().end()) {
      return absl::InvalidArgumentError(absl::StrCat("no address for direct peer ", peer));
    }
    std::vector<std::string> wanted;
    int64_t scratch_bytes = 0;
    for (int32_t k : buffers) {
      wanted.push_back(local.peer_buffers[k].name);
      scratch_bytes = std::max(scratch_bytes, local.peer_buffers[k].scratch_bytes);
    }
    SHARDSYNC_ASSIGN_OR_RETURN(auto mapped, direct_.targets->Map(peer, address->second, wanted, scratch_bytes,
                                                                 absl::Now() + config_.rpc_deadline));
    for (size_t i = 0; i < buffers.size(); ++i) {
      prepared.peer_memory[buffers[i]] = mapped[i];
      sizes[own + buffers[i]] = mapped[i]->bytes();
    }
  }
  SHARDSYNC_RETURN_IF_ERROR(executor::CheckDirectWritesFit(local.plan, config_.rank, direct, sizes, names));
  prepared.direct_mapped = true;
  return absl::OkStatus();
}

executor::Transport& Agent::DataTransport(const Prepared& prepared) const {
  // A device transport with no communicator asked for: every peer is direct.
  const bool without_communicator = transport_.device_memory() && prepared.peers.communicator_id.empty();
  return without_communicator && direct_.signals != nullptr ? *direct_.signals : transport_;
}

absl::Status Agent::CheckDirectSendersMapped(const Prepared& prepared) const {
  absl::MutexLock lock(&handed_mu_);
  for (const planner::Stage& stage : prepared.local->schedule.stages) {
    for (const planner::PeerStream& stream : stage.receives) {
      if (!std::binary_search(prepared.direct_peers.begin(), prepared.direct_peers.end(), stream.peer)) continue;
      const auto handed = handed_.find(stream.peer);
      if (handed == handed_.end()) {
        return absl::FailedPreconditionError(
            absl::StrCat("rank ", stream.peer, " has not mapped the targets of rank ", config_.rank));
      }
      for (const auto& [name, registered_at] : handed->second) {
        const std::shared_ptr<const BufferEntry> entry = registry_.Find(name);
        if (!entry || entry->registered_at != registered_at) {
          return absl::FailedPreconditionError(absl::StrCat("rank ", stream.peer, " mapped buffer '", name,
                                                            "' of rank ", config_.rank,
                                                            " before it was registered again"));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::TargetMemoryResponse> Agent::TargetMemory(const v1::TargetMemoryRequest& request) {
  if (request.from_rank() < 0 || request.from_rank() == config_.rank) {
    return absl::InvalidArgumentError(absl::StrCat("target memory asked for by rank ", request.from_rank()));
  }
  v1::TargetMemoryResponse response;
  std::vector<std::pair<std::string, int64_t>> handed;
  // A peer may prepare before this rank does: the scratch of the plan is made now.
  if (std::count(request.buffers().begin(), request.buffers().end(), planner::kScratchBufferName) > 0) {
    if (request.scratch_bytes() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", request.from_rank(), " asked for the scratch of rank ",
                                                     config_.rank, " without its size"));
    }
    SHARDSYNC_RETURN_IF_ERROR(registry_.ProvideScratch(request.scratch_bytes()));
  }
  for (const std::string& name : request.buffers()) {
    int64_t registered_at = 0;
    SHARDSYNC_ASSIGN_OR_RETURN(*response.add_buffers(), registry_.TargetHandle(name, &registered_at));
    response.add_registered_at(registered_at);
    handed.emplace_back(name, registered_at);
  }
  absl::MutexLock lock(&handed_mu_);
  handed_[request.from_rank()] = std::move(handed);
  return response;
}

v1::PrepareResponse Agent::Prepare(const v1::PrepareRequest& request) {
  v1::PrepareResponse response;
  absl::MutexLock lock(&mu_);
  bool schedule_missing = false;
  const absl::Status status = PrepareLocked(request, /*map_direct=*/true, &schedule_missing);
  response.set_ok(status.ok());
  response.set_schedule_missing(schedule_missing);
  if (!status.ok() && !schedule_missing) {
    response.set_refusal(std::string(status.message()));
    spdlog::warn("refusing sync {}: {}", request.sync_id(), std::string(status.message()));
  }
  return response;
}

absl::Status Agent::NotStarted(const std::string& sync_id, absl::string_view why) const {
  spdlog::warn("sync {} stops before writing on rank {}: {}", sync_id, config_.rank, std::string(why));
  return absl::FailedPreconditionError(absl::StrCat("no byte moved on rank ", config_.rank, ": ", why));
}

absl::StatusOr<Agent::Prepared> Agent::TakePrepared(const v1::ExecuteRequest& request, absl::Status* ready) {
  absl::MutexLock lock(&mu_);
  if (request.has_prepare()) {
    // Without its communicator or schedule a rank cannot take part in the agreement;
    // it answers at once and the coordinator aborts the ranks waiting in it.
    if (request.prepare().communicator_generation() != built_generation_) {
      return NotStarted(
          request.sync_id(),
          absl::StrCat("communicator generation ", request.prepare().communicator_generation(), " is not built here"));
    }
    bool schedule_missing = false;
    *ready = PrepareLocked(request.prepare(), /*map_direct=*/false, &schedule_missing);
    if (schedule_missing) return NotStarted(request.sync_id(), ready->message());
  }
  auto it = prepared_.find(request.digest());
  if (it == prepared_.end() || it->second.sync_id != request.sync_id()) {
    // A request.prepare refused before it could name this sync: its refusal says why.
    if (!ready->ok()) return NotStarted(request.sync_id(), ready->message());
    return NotStarted(request.sync_id(), absl::StrCat("sync ", request.sync_id(), " was not prepared"));
  }
  if (aborted_sync_id_ == request.sync_id()) {
    return NotStarted(request.sync_id(), "the sync was aborted before it started");
  }
  last_sync_id_ = request.sync_id();
  running_sync_id_ = request.sync_id();
  return it->second;
}

absl::Status Agent::HoldBuffers(const Prepared& prepared, std::vector<std::shared_ptr<const BufferEntry>>& held,
                                executor::BufferTable& table) const {
  held.assign(prepared.local->buffer_names.size(), nullptr);
  table.assign(prepared.local->buffer_count(), nullptr);
  for (size_t k = 0; k < prepared.peer_memory.size(); ++k) {
    const std::shared_ptr<executor::MappedBuffer>& peer = prepared.peer_memory[k];
    if (!peer) continue;
    // A peer's client can shrink its shared memory too: writing past it would kill us.
    if (const absl::Status intact = peer->CheckIntact(); !intact.ok()) {
      const daemon::PeerBufferName& name = prepared.local->peer_buffers[k];
      return absl::FailedPreconditionError(
          absl::StrCat("buffer '", name.name, "' of rank ", name.rank, ": ", intact.message()));
    }
    table[held.size() + k] = peer->data();
  }
  for (size_t id = 0; id < held.size(); ++id) {
    const std::string& name = prepared.local->buffer_names[id];
    held[id] = registry_.Find(name);
    if (!held[id]) return absl::FailedPreconditionError(absl::StrCat("buffer '", name, "' is no longer registered"));
    if (const absl::Status intact = held[id]->memory->CheckIntact(); !intact.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("buffer '", name, "': ", intact.message()));
    }
    table[id] = held[id]->memory->data();
    // The scratch changes size without a new registry version (a peer may ask for the
    // next plan's first): this plan's must be the one held.
    if (name == planner::kScratchBufferName && held[id]->memory->bytes() != prepared.local->scratch_bytes) {
      return absl::FailedPreconditionError(absl::StrCat("the scratch holds ", held[id]->memory->bytes(),
                                                        " bytes; this plan's is ", prepared.local->scratch_bytes));
    }
  }
  // The registry changed since the check: check the mappings held instead.
  if (registry_.version() != prepared.checked_version) SHARDSYNC_RETURN_IF_ERROR(Check(*prepared.local, held));
  // Sources written by the device's other processes: read them after the writes.
  return device_.WaitFor(registry_.ReadyEvents());
}

absl::Status Agent::SetUpAndAgree(const v1::ExecuteRequest& request, const Prepared& prepared,
                                  const absl::Status& ready, absl::Time deadline) {
  executor::Transport& data = DataTransport(prepared);
  std::vector<executor::Transport*> transports = {&data};
  if (direct_.signals != nullptr && direct_.signals != &data) transports.push_back(direct_.signals);
  for (executor::Transport* transport : transports) {
    if (const absl::Status setup = transport->Setup(prepared.peers, deadline); !setup.ok()) {
      Finished(false);
      return NotStarted(request.sync_id(), setup.message());
    }
  }
  {
    absl::MutexLock lock(&mu_);
    built_generation_ = prepared.peers.generation;
  }
  // One call (request.prepare) needs the agreement, and so does a world where peers
  // write each other's targets; after a Prepare fan-out it closes the gap between
  // Prepare and Execute where it is cheap.
  // Without a device collective the ranks agree over host messages: the signal boards
  // of the agents of this host, the agents' channels for the others.
  if (prepared.peers.world_size > 1 && (request.has_prepare() || prepared.agree_in_execute || data.fast_agreement())) {
    executor::Transport& agreement = data.fast_agreement() || direct_.signals == nullptr ? data : *direct_.signals;
    const absl::StatusOr<bool> all_ready = agreement.Agree(request.sync_id(), prepared.peers, ready.ok(), deadline);
    if (!all_ready.ok()) {
      Finished(false);
      return NotStarted(request.sync_id(),
                        absl::StrCat("agreeing with the other ranks: ", all_ready.status().message()));
    }
    if (ready.ok() && !*all_ready) {
      Finished(true);
      return NotStarted(request.sync_id(), "another rank was not ready");
    }
  }
  if (!ready.ok()) {
    Finished(true);
    return NotStarted(request.sync_id(), ready.message());
  }
  return absl::OkStatus();
}

absl::Status Agent::Verify(const Prepared& prepared, const executor::BufferTable& table,
                           v1::ExecuteResponse& response) {
  const absl::Time start = absl::Now();
  SHARDSYNC_ASSIGN_OR_RETURN(const executor::Checksums sums,
                             executor::ComputeChecksums(device_, prepared.local->plan, prepared.local->schedule, table,
                                                        prepared.staging_bytes));
  for (const auto& [key, side] : sums) {
    v1::TensorChecksum* checksum = response.add_checksums();
    checksum->set_tensor(key.first);
    checksum->set_target_rank(key.second);
    checksum->set_sources(side.sources);
    checksum->set_targets(side.targets);
  }
  response.mutable_stats()->set_verify_seconds(absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

void Agent::RecordOutcome(const std::string& sync_id, bool writes_targets,
                          const absl::StatusOr<executor::ExecutionStats>& stats) {
  absl::MutexLock lock(&mu_);
  running_sync_id_.clear();
  writing_sync_id_.clear();
  if (writes_targets) {
    target_valid_ = stats.ok();
    link_.SetTargetsValid(target_valid_);
  }
  ++(stats.ok() ? executed_ : failed_);
  if (!stats.ok()) {
    built_generation_ = -1;  // the communicator may be aborted: the coordinator renews it
    spdlog::error("sync {} failed on rank {}: {}", sync_id, config_.rank, std::string(stats.status().message()));
    return;
  }
  moved_.sent_bytes += stats->sent_bytes;
  moved_.received_bytes += stats->received_bytes;
  moved_.local_bytes += stats->local_bytes;
}

absl::StatusOr<v1::ExecuteResponse> Agent::Execute(const v1::ExecuteRequest& request) {
  const absl::Time entered = absl::Now();
  absl::MutexLock execute_lock(&execute_mu_);
  // Up to the agreement nothing is written on this rank: the coordinator tells a sync
  // refused everywhere (FAILED_PRECONDITION from every rank) from one that failed.
  // Reset before TakePrepared's abort check: Abort marks the sync before it aborts the
  // transport, so an Abort is either seen there or reaches the transport after this.
  transport_.Reset();
  if (direct_.signals != nullptr && direct_.signals != &transport_) direct_.signals->Reset();
  absl::Status ready = absl::OkStatus();  // this rank's vote: every check passed
  SHARDSYNC_ASSIGN_OR_RETURN(Prepared prepared, TakePrepared(request, &ready));
  // Hold every mapping for the whole run: a client leaving mid-sync cannot unmap it.
  std::vector<std::shared_ptr<const BufferEntry>> held;
  executor::BufferTable table;
  if (ready.ok()) ready = HoldBuffers(prepared, held, table);
  if (ready.ok()) ready = CheckDirectSendersMapped(prepared);
  const absl::Time checked = absl::Now();
  const absl::Time deadline = checked + prepared.deadline;
  SHARDSYNC_RETURN_IF_ERROR(SetUpAndAgree(request, prepared, ready, deadline));
  const absl::Time agreed = absl::Now();

  // A partial sync may only read on this rank: its targets keep their bytes and validity.
  const planner::Schedule& schedule = prepared.local->schedule;
  bool writes_targets = !schedule.fills.empty();
  for (const planner::Stage& stage : schedule.stages) {
    writes_targets = writes_targets || !stage.local_segments.empty() || !stage.receives.empty();
  }
  if (writes_targets) {
    absl::MutexLock lock(&mu_);
    writing_sync_id_ = request.sync_id();
  }
  executor::RoundEngine engine(device_, DataTransport(prepared));
  const absl::StatusOr<executor::ExecutionStats> stats =
      engine.Run(request.sync_id(), prepared.local->plan, schedule, table, prepared.staging_bytes, deadline, &progress_,
                 executor::DirectLinks{prepared.direct_peers, direct_.signals});
  v1::ExecuteResponse response;
  const absl::Status verified = stats.ok() && request.verify() ? Verify(prepared, table, response) : absl::OkStatus();
  RecordOutcome(request.sync_id(), writes_targets, stats);
  // From here on bytes were written: never answer FAILED_PRECONDITION (see the proto).
  const auto after_writing = [](const absl::Status& status) {
    return absl::IsFailedPrecondition(status) ? absl::InternalError(status.message()) : status;
  };
  if (!stats.ok()) return after_writing(stats.status());  // the coordinator names the rank
  if (!verified.ok()) return after_writing(verified);
  v1::RankStats& out = *response.mutable_stats();
  out.set_rank(config_.rank);
  out.set_rounds(stats->rounds);
  out.set_chunks(stats->chunks);
  out.set_sent_bytes(stats->sent_bytes);
  out.set_received_bytes(stats->received_bytes);
  out.set_local_bytes(stats->local_bytes);
  out.set_fill_bytes(stats->fill_bytes);
  out.set_peak_staging_bytes(stats->peak_staging_bytes);
  out.set_peak_peer_staging_bytes(stats->peak_peer_staging_bytes);
  out.set_direct_sent_bytes(stats->direct_sent_bytes);
  out.set_direct_received_bytes(stats->direct_received_bytes);
  out.set_quantized_bytes(stats->quantized_bytes);
  out.set_scratch_bytes(prepared.local->scratch_bytes);
  out.set_seconds(stats->seconds);
  out.set_local_seconds(stats->local_seconds);
  out.set_execute_seconds(absl::ToDoubleSeconds(absl::Now() - entered));
  out.set_check_seconds(absl::ToDoubleSeconds(checked - entered));
  out.set_agree_seconds(absl::ToDoubleSeconds(agreed - checked));
  out.set_direct_wait_seconds(stats->direct_wait_seconds);
  return response;
}

void Agent::Finished(bool communicator_intact) {
  absl::MutexLock lock(&mu_);
  running_sync_id_.clear();
  if (!communicator_intact) built_generation_ = -1;
}

void Agent::Abort(const v1::AbortRequest& request) {
  spdlog::warn("aborting sync {}: {}", request.sync_id(), request.reason());
  {
    absl::MutexLock lock(&mu_);
    aborted_sync_id_ = request.sync_id();
    if (writing_sync_id_ == request.sync_id()) {  // stopped part way
      target_valid_ = false;
      link_.SetTargetsValid(false);
    }
  }
  const std::string reason = absl::StrCat("sync ", request.sync_id(), " aborted: ", request.reason());
  transport_.Abort(request.sync_id(), reason);
  if (direct_.signals != nullptr && direct_.signals != &transport_) direct_.signals->Abort(request.sync_id(), reason);
}

absl::Status Agent::Transfer(const v1::TransferRequest& request, absl::Time deadline) {
  // Only a chunk of the sync this agent prepared is held (until its receive is posted),
  // and no longer than that sync may run: nobody parks memory here. A sync that prepares
  // in its Execute call (one call) may hear a peer's one-byte vote first: that alone
  // waits for it, at most an RPC deadline.
  {
    absl::MutexLock lock(&mu_);
    const auto find = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::find_if(prepared_.begin(), prepared_.end(),
                          [&](const auto& entry) { return entry.second.sync_id == request.sync_id(); });
    };
    const auto known = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return find() != prepared_.end() || aborted_sync_id_ == request.sync_id();
    };
    if (request.round() == executor::kAgreementRound && request.data().size() == 1) {
      mu_.AwaitWithDeadline(absl::Condition(&known), std::min(deadline, absl::Now() + config_.rpc_deadline));
    }
    const auto prepared = find();
    if (prepared == prepared_.end()) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", config_.rank, " has prepared no sync '",
                                                        request.sync_id(), "': a chunk for it is refused"));
    }
    deadline = std::min(deadline, absl::Now() + prepared->second.deadline);
  }
  const std::string& data = request.data();
  return mailbox_.Deliver(request.sync_id(), request.from_rank(), request.round(),
                          reinterpret_cast<const uint8_t*>(data.data()), static_cast<int64_t>(data.size()), deadline);
}

}  // namespace shardsync::agent
