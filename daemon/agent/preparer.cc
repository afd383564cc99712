#include "daemon/agent/preparer.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "executor/buffer_check.h"
#include "planner/quantize.h"
#include "planner/schedule.h"

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

// What every request must satisfy, whether it carries a schedule or renews one.
absl::Status CheckRequest(const v1::PrepareRequest& request, int32_t rank, int64_t max_staging_bytes) {
  if (request.staging_bytes() <= 0 || request.staging_bytes() > max_staging_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("staging budget of ", request.staging_bytes(), " bytes is outside (0, ", max_staging_bytes, "]"));
  }
  return CheckPeers(request, rank);
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

executor::PeerSetup PeersOf(const v1::PrepareRequest& request, int32_t rank) {
  executor::PeerSetup peers;
  peers.rank = rank;
  peers.world_size = request.world_size();
  peers.addresses.insert(request.peer_addresses().begin(), request.peer_addresses().end());
  peers.boards.insert(request.peer_signal_boards().begin(), request.peer_signal_boards().end());
  peers.communicator_id = request.communicator_id();
  peers.generation = request.communicator_generation();
  return peers;
}

// The request's fields that every sync of one plan may change. Cached peers (one call)
// are those `prepared` holds, of the request's communicator generation.
absl::Status NameSync(const v1::PrepareRequest& request, int32_t rank, PreparedSync& prepared) {
  if (!request.peers_cached()) {
    prepared.peers = PeersOf(request, rank);
  } else if (prepared.peers.generation != request.communicator_generation() ||
             prepared.peers.communicator_id != request.communicator_id() ||
             prepared.peers.world_size != request.world_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the peers of communicator generation ", request.communicator_generation(),
        " are not held here (this agent holds generation ", prepared.peers.generation, "): prepare again"));
  }
  prepared.sync_id = request.sync_id();
  prepared.deadline = absl::Milliseconds(request.deadline_ms());
  prepared.agree_in_execute = request.agree_in_execute();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PreparedSync> Preparer::Prepare(const v1::PrepareRequest& request) const {
  absl::StatusOr<PreparedSync> prepared = PrepareAndMap(request);
  if (!prepared.ok()) Refused(request.sync_id());
  return prepared;
}

absl::Status Preparer::Renew(const v1::PrepareRequest& request, bool map_direct, PreparedSync& prepared) const {
  const absl::Status renewed = RenewAndMap(request, map_direct, prepared);
  if (!renewed.ok()) Refused(request.sync_id());
  return renewed;
}

void Preparer::Refused(const std::string& sync_id) const {
  PlannedWriters none;
  none.refused = true;
  if (direct_.desk != nullptr) direct_.desk->Expect(sync_id, std::move(none));
}

absl::StatusOr<PreparedSync> Preparer::PrepareAndMap(const v1::PrepareRequest& request) const {
  SHARDSYNC_RETURN_IF_ERROR(CheckRequest(request, config_.rank, config_.max_staging_bytes));
  const int64_t version = registry_.version();
  SHARDSYNC_ASSIGN_OR_RETURN(auto local, daemon::DecodeSchedule(request, config_.rank));
  SHARDSYNC_RETURN_IF_ERROR(planner::CheckChunks(local.plan, local.schedule, request.staging_bytes()));
  SHARDSYNC_RETURN_IF_ERROR(CheckStreams(local.schedule, request.world_size()));
  SHARDSYNC_RETURN_IF_ERROR(registry_.ProvideScratch(local.scratch_bytes));
  SHARDSYNC_RETURN_IF_ERROR(CheckBuffers(local));
  PreparedSync prepared;
  prepared.local = std::make_shared<const daemon::LocalSchedule>(std::move(local));
  prepared.staging_bytes = request.staging_bytes();
  prepared.checked_version = version;
  SHARDSYNC_RETURN_IF_ERROR(NameSync(request, config_.rank, prepared));
  SHARDSYNC_RETURN_IF_ERROR(MapDirect(request, prepared));
  return prepared;
}

absl::Status Preparer::RenewAndMap(const v1::PrepareRequest& request, bool map_direct, PreparedSync& prepared) const {
  SHARDSYNC_RETURN_IF_ERROR(CheckRequest(request, config_.rank, config_.max_staging_bytes));
  SHARDSYNC_RETURN_IF_ERROR(CheckStreams(prepared.local->schedule, request.world_size()));
  // A peer's ask for another plan's scratch may have replaced this plan's.
  SHARDSYNC_RETURN_IF_ERROR(registry_.ProvideScratch(prepared.local->scratch_bytes));
  SHARDSYNC_RETURN_IF_ERROR(NameSync(request, config_.rank, prepared));
  const std::set<int32_t> direct(request.direct_peers().begin(), request.direct_peers().end());
  const bool mapped =
      prepared.direct_mapped && !map_direct &&
      std::equal(direct.begin(), direct.end(), prepared.direct_peers.begin(), prepared.direct_peers.end());
  if (!mapped) prepared.direct_mapped = false;
  // Buffers, roles and bounds change only with the registry: checked once per version.
  const int64_t version = registry_.version();
  if (prepared.checked_version != version) {
    SHARDSYNC_RETURN_IF_ERROR(CheckBuffers(*prepared.local));
    prepared.checked_version = version;
  } else {
    // Host memory can shrink under its registration without the registry knowing.
    for (const std::string& name : prepared.local->buffer_names) {
      const std::shared_ptr<const BufferEntry> entry = registry_.Find(name);
      if (!entry) continue;  // unused here: CheckBuffers would have refused a missing one
      if (const absl::Status intact = entry->memory->CheckIntact(); !intact.ok()) {
        return absl::FailedPreconditionError(absl::StrCat("buffer '", name, "': ", intact.message()));
      }
    }
  }
  if (!mapped) return MapDirect(request, prepared);
  // The peers map nothing anew, but one may ask (its mappings were dropped).
  if (direct_.desk != nullptr) direct_.desk->Expect(request.sync_id(), prepared.writers);
  return absl::OkStatus();
}

absl::Status Preparer::CheckBuffers(const daemon::LocalSchedule& local,
                                    std::vector<std::shared_ptr<const BufferEntry>> entries) const {
  // Each buffer looked up once: a schedule has thousands of segments and a few buffers.
  entries.resize(local.buffer_names.size());
  std::vector<int64_t> sizes(local.buffer_names.size(), 0);
  const auto check = [&](int32_t id, v1::Role role, int32_t tensor_index) -> absl::Status {
    const std::string& name = local.buffer_names.at(id);
    const std::string& tensor = local.plan.tensor_names[tensor_index];
    if (!entries[id]) {
      entries[id] = registry_.Find(name);
      if (entries[id]) {  // checked once per call; Execute checks the mappings it holds itself
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

namespace {

// The buffers of each direct peer that `local`'s sends write (index - own buffers);
// refuses a stream with a rank that is neither direct nor reachable without a
// communicator, and a direct send that names no buffer of its peer.
absl::StatusOr<std::map<int32_t, std::vector<int32_t>>> DirectWrites(const daemon::LocalSchedule& local,
                                                                     const std::vector<int32_t>& direct,
                                                                     bool communicator) {
  const auto is_direct = [&](int32_t peer) { return std::binary_search(direct.begin(), direct.end(), peer); };
  const int32_t own = static_cast<int32_t>(local.buffer_names.size());
  std::map<int32_t, std::vector<int32_t>> written;
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
  return written;
}

// This rank's buffers each direct peer writes in `local`'s receives.
PlannedWriters DirectWriters(const daemon::LocalSchedule& local, const std::vector<int32_t>& direct) {
  PlannedWriters writers;
  writers.scratch_bytes = local.scratch_bytes;
  const int32_t own = static_cast<int32_t>(local.buffer_names.size());
  for (const planner::Stage& stage : local.schedule.stages) {
    for (const planner::PeerStream& stream : stage.receives) {
      if (!std::binary_search(direct.begin(), direct.end(), stream.peer)) continue;
      std::set<std::string>& buffers = writers.buffers[stream.peer];
      for (int32_t index : stream.segments) {
        const int32_t buffer = local.plan.segments[index].dst.buffer;
        if (buffer < own) buffers.insert(local.buffer_names[buffer]);
      }
    }
  }
  return writers;
}

}  // namespace

absl::Status Preparer::MapDirect(const v1::PrepareRequest& request, PreparedSync& prepared) const {
  const daemon::LocalSchedule& local = *prepared.local;
  const std::set<int32_t> unique(request.direct_peers().begin(), request.direct_peers().end());
  const std::vector<int32_t> direct(unique.begin(), unique.end());
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
  SHARDSYNC_ASSIGN_OR_RETURN(const auto written, DirectWrites(local, direct, communicator));
  // Before asking the peers: they ask this rank alike, and wait for this.
  prepared.writers = DirectWriters(local, direct);
  if (direct_.desk != nullptr) direct_.desk->Expect(request.sync_id(), prepared.writers);
  prepared.peer_memory.assign(local.peer_buffers.size(), nullptr);
  prepared.direct_peers = direct;
  prepared.direct_mapped = direct.empty();
  if (direct.empty()) return absl::OkStatus();  // nothing to map or bound
  const int32_t own = static_cast<int32_t>(local.buffer_names.size());
  std::vector<int64_t> sizes(local.buffer_count(), 0);
  std::vector<std::string> names = local.buffer_names;
  for (const daemon::PeerBufferName& peer : local.peer_buffers) names.push_back(peer.name);
  for (const auto& [peer, buffers] : written) {
    const auto address = prepared.peers.addresses.find(peer);
    if (address == prepared.peers.addresses.end()) {
      return absl::InvalidArgumentError(absl::StrCat("no address for direct peer ", peer));
    }
    std::vector<std::string> wanted;
    int64_t scratch_bytes = 0;
    for (int32_t k : buffers) {
      wanted.push_back(local.peer_buffers[k].name);
      scratch_bytes = std::max(scratch_bytes, local.peer_buffers[k].scratch_bytes);
    }
    SHARDSYNC_ASSIGN_OR_RETURN(auto mapped, direct_.targets->Map(peer, address->second, request.sync_id(), wanted,
                                                                 scratch_bytes, absl::Now() + config_.rpc_deadline));
    for (size_t i = 0; i < buffers.size(); ++i) {
      prepared.peer_memory[buffers[i]] = mapped[i];
      sizes[own + buffers[i]] = mapped[i]->bytes();
    }
  }
  SHARDSYNC_RETURN_IF_ERROR(executor::CheckDirectWritesFit(local.plan, config_.rank, direct, sizes, names));
  prepared.direct_mapped = true;
  return absl::OkStatus();
}

}  // namespace shardsync::agent
