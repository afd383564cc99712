#include "executor/round_engine.h"

#include <algorithm>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "executor/delta_codec.h"
#include "executor/host_copy.h"

namespace shardsync::executor {
namespace {

// Where a chunk starts on one side when its parts lie back to back there, in one buffer
// and already in the target dtype: then it moves without staging. nullptr otherwise.
uint8_t* UnstagedAddress(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                         const BufferTable& buffers, bool source) {
  uint8_t* start = nullptr;
  uint8_t* next = nullptr;
  int32_t buffer = -1;
  for (const planner::ChunkPart& part : parts) {
    const planner::Segment& s = plan.segments[part.segment];
    if (s.src_dtype != s.dst_dtype || !IsContiguousRange(s, part.begin, part.end, source)) return nullptr;
    int64_t offset = source ? s.src_base : s.dst_base;
    int64_t rest = part.begin;
    for (int k = s.axes - 1; k >= 0; --k) {
      offset += (rest % s.shape[k]) * (source ? s.src_strides[k] : s.dst_strides[k]);
      rest /= s.shape[k];
    }
    const int32_t id = (source ? s.src : s.dst).buffer;
    const int64_t element = planner::ElementBytes(s.dst_dtype);
    uint8_t* at = buffers[id] + offset * element;
    if (start == nullptr) {
      start = at;
      buffer = id;
    } else if (id != buffer || at != next) {
      return nullptr;
    }
    next = at + (part.end - part.begin) * element;
  }
  return start;
}

}  // namespace

absl::StatusOr<ExecutionStats> RoundEngine::Run(const RunInputs& run) {
  if (run.delta != nullptr && (run.delta->snapshots == nullptr || !run.plan.quantizes.empty())) {
    // A quantized target's bytes arrive in a scratch other groups reuse: no baseline.
    return absl::InvalidArgumentError("delta sync needs snapshots and a plan without block-quantized targets");
  }
  absl::StatusOr<ExecutionStats> stats = RunStages(run);
  // A failed run may have direct copies queued into peers' memory: they end before the
  // caller may close the mappings they write.
  if (!stats.ok() && !run.direct.peers.empty()) device_.FinishDirect().IgnoreError();
  return stats;
}

absl::Status RoundEngine::HandOffScratch(absl::string_view sync_id, int32_t stage_number, const planner::Stage& stage,
                                         absl::Time deadline, const DirectLinks& direct) {
  uint8_t free_byte = 1;
  std::vector<SendOp> to_writers;
  std::vector<RecvOp> from_readers;
  for (const planner::PeerStream& stream : stage.receives) {
    if (direct.Has(stream.peer)) to_writers.push_back(SendOp{stream.peer, &free_byte, 1});
  }
  for (const planner::PeerStream& stream : stage.sends) {
    if (direct.Has(stream.peer)) from_readers.push_back(RecvOp{stream.peer, nullptr, 1});
  }
  if (to_writers.empty() && from_readers.empty()) return absl::OkStatus();
  std::vector<uint8_t> received(from_readers.size(), 0);
  for (size_t i = 0; i < from_readers.size(); ++i) from_readers[i].data = &received[i];
  // This rank's earlier quantizes have read its scratch before a peer may write it.
  if (!to_writers.empty()) SHARDSYNC_RETURN_IF_ERROR(device_.Synchronize());
  return direct.signals->RunRound(sync_id, ScratchFreeRound(stage_number), to_writers, from_readers, deadline);
}

struct RoundEngine::Tally {
  ExecutionStats stats;
  ExecutionProgress* progress = nullptr;
  int64_t slot_bytes = 0;
  // Staged bytes per peer (both directions) in this round and the one before: with two
  // slots, a round's staging is in use beside the previous round's.
  std::map<int32_t, int64_t> staged, staged_before;
  int64_t in_use_before = 0;
  std::atomic<int64_t> apply_nanos{0};  // the transport's, applying deltas into receives

  void Progressed() {
    progress->bytes_done = stats.local_bytes + stats.sent_bytes + stats.received_bytes;
    progress->rounds_done = stats.rounds;
  }
};

absl::StatusOr<ExecutionStats> RoundEngine::RunStages(const RunInputs& run) {
  if (!run.direct.peers.empty() && run.direct.signals == nullptr) {
    return absl::InvalidArgumentError("direct peers without a transport for their completion messages");
  }
  const absl::Time start = absl::Now();
  const planner::Plan& plan = run.plan;
  const planner::Schedule& schedule = run.schedule;
  ExecutionProgress unused;
  Tally tally;
  tally.progress = run.progress != nullptr ? run.progress : &unused;
  int64_t total = 0;
  for (const planner::Stage& stage : schedule.stages) {
    for (int32_t index : stage.local_segments) total += planner::SegmentBytes(plan.segments[index]);
    for (const auto* streams : {&stage.sends, &stage.receives}) {
      for (const planner::PeerStream& stream : *streams) {
        total += stream.bytes;
        tally.staged[stream.peer] = 0;
      }
    }
  }
  tally.staged_before = tally.staged;
  tally.progress->bytes_total = total;
  tally.progress->rounds_total = schedule.rounds();
  tally.Progressed();
  // A sync that failed before reading its local time leaves it behind: not this one's.
  SHARDSYNC_RETURN_IF_ERROR(device_.TakeLocalSeconds().status());
  for (int32_t index : schedule.fills) {
    const planner::FillOp& f = plan.fills[index];
    tally.stats.fill_bytes += planner::NumElements(f.fill.shape) * planner::ElementBytes(f.dtype);
  }
  tally.slot_bytes = planner::MaxChunkBytes(run.staging_bytes);
  for (size_t k = 0; k < schedule.stages.size(); ++k) SHARDSYNC_RETURN_IF_ERROR(RunStage(run, k, tally));
  SHARDSYNC_RETURN_IF_ERROR(transport_.Finish(run.deadline));
  SHARDSYNC_RETURN_IF_ERROR(device_.Synchronize());
  SHARDSYNC_ASSIGN_OR_RETURN(tally.stats.local_seconds, device_.TakeLocalSeconds());
  tally.Progressed();
  tally.stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  tally.stats.apply_seconds = static_cast<double>(tally.apply_nanos.load()) * 1e-9;
  return tally.stats;
}

absl::Status RoundEngine::RunStage(const RunInputs& run, size_t k, Tally& tally) {
  const planner::Plan& plan = run.plan;
  const planner::Stage& stage = run.schedule.stages[k];
  const DirectLinks& direct = run.direct;
  ExecutionStats& stats = tally.stats;
  // The relay stage reads targets the stage before it wrote: after all of its work.
  if (k > 0) SHARDSYNC_RETURN_IF_ERROR(device_.Fence());
  const absl::Span<const int32_t> fills =
      k == 0 ? absl::Span<const int32_t>(run.schedule.fills) : absl::Span<const int32_t>();
  SHARDSYNC_RETURN_IF_ERROR(device_.CopyLocal(plan, stage.local_segments, fills, run.buffers));
  for (int32_t index : stage.local_segments) stats.local_bytes += planner::SegmentBytes(plan.segments[index]);
  // Direct sends: one batch of copies into the peers' targets, beside the rounds.
  std::vector<int32_t> direct_segments;
  std::vector<SendOp> done_sends;
  std::vector<RecvOp> done_receives;
  uint8_t done_byte = 1;
  for (const planner::PeerStream& stream : stage.sends) {
    if (!direct.Has(stream.peer)) continue;
    direct_segments.insert(direct_segments.end(), stream.segments.begin(), stream.segments.end());
    done_sends.push_back(SendOp{stream.peer, &done_byte, 1});
    stats.sent_bytes += stream.bytes;
    stats.direct_sent_bytes += stream.bytes;
  }
  for (const planner::PeerStream& stream : stage.receives) {
    if (direct.Has(stream.peer)) done_receives.push_back(RecvOp{stream.peer, nullptr, 1});
  }
  std::vector<uint8_t> done_received(done_receives.size(), 0);
  for (size_t i = 0; i < done_receives.size(); ++i) done_receives[i].data = &done_received[i];
  if (k > 0 && run.schedule.scratch_handoff) {
    SHARDSYNC_RETURN_IF_ERROR(HandOffScratch(run.sync_id, static_cast<int32_t>(k), stage, run.deadline, direct));
  }
  if (!direct_segments.empty()) SHARDSYNC_RETURN_IF_ERROR(device_.CopyDirect(plan, direct_segments, run.buffers));
  for (int32_t round = 0; round < stage.rounds; ++round) SHARDSYNC_RETURN_IF_ERROR(RunRound(run, stage, round, tally));
  // The stage's direct copies are in the peers' memory before they hear so, and the
  // peers' copies into this rank's targets are before the next stage reads them.
  if (!done_sends.empty() || !done_receives.empty()) {
    const absl::Time waiting = absl::Now();
    if (!done_sends.empty()) SHARDSYNC_RETURN_IF_ERROR(device_.FinishDirect());
    SHARDSYNC_RETURN_IF_ERROR(direct.signals->RunRound(run.sync_id, DirectDoneRound(static_cast<int32_t>(k)),
                                                       done_sends, done_receives, run.deadline));
    stats.direct_wait_seconds += absl::ToDoubleSeconds(absl::Now() - waiting);
    for (const planner::PeerStream& stream : stage.receives) {
      if (!direct.Has(stream.peer)) continue;
      stats.received_bytes += stream.bytes;
      stats.direct_received_bytes += stream.bytes;
    }
    tally.Progressed();
  }
  // The stage's bytes are all here: quantize what they complete.
  if (!stage.quantizes.empty()) {
    SHARDSYNC_RETURN_IF_ERROR(device_.Quantize(plan, stage.quantizes, run.buffers));
    for (int32_t index : stage.quantizes) {
      stats.quantized_bytes += plan.quantizes[index].rows * plan.quantizes[index].cols;
    }
  }
  return absl::OkStatus();
}

void RoundEngine::SendAsDelta(const RunInputs& run, int32_t round, SendOp& send, std::deque<std::string>& encoded,
                              ExecutionStats& stats) {
  const absl::Time start = absl::Now();
  const DeltaRun& delta = *run.delta;
  const uint8_t* chunk = send.data;
  const int64_t bytes = send.bytes;
  const char* whole = nullptr;  // why the chunk goes whole, if it does
  bool keep = true;             // the peer may take a delta of it next time
  if (const auto full = delta.full_peers.find(send.peer); full != delta.full_peers.end()) {
    whole = full->second.c_str();
    keep = full->second != kSameNodeWord;  // never a delta link: no snapshot spends the budget
  } else if (const auto version = delta.peer_versions.find(send.peer); version == delta.peer_versions.end()) {
    whole = "new_target";
  } else if (const SnapshotLookup snapshot =
                 delta.snapshots->Find(run.sync_id, delta.digest, send.peer, round, version->second, bytes);
             snapshot.data == nullptr) {
    whole = snapshot.missing;
  } else {
    std::string& out = encoded.emplace_back();
    const uint8_t* baseline = reinterpret_cast<const uint8_t*>(snapshot.data->data());
    std::vector<int64_t> ends;  // each piece encoded on its own (transport.h)
    int64_t changed_words = 0;
    for (int64_t at = 0; at < bytes; at += kPieceBytes) {
      const int64_t span = std::min(kPieceBytes, bytes - at);
      changed_words += EncodeDelta(chunk + at, baseline + at, span, out).changed_words;
      ends.push_back(static_cast<int64_t>(out.size()));
    }
    if (static_cast<int64_t>(out.size()) < bytes) {
      send = SendOp{send.peer, reinterpret_cast<const uint8_t*>(out.data()), static_cast<int64_t>(out.size()),
                    std::move(ends), bytes};
      ++stats.delta_chunks;
      stats.changed_words += changed_words;
      stats.peer_wire[send.peer].changed_words += changed_words;
    } else {
      whole = "no_gain";
    }
  }
  if (whole != nullptr) ++stats.full_chunks[whole];
  stats.peer_wire[send.peer].wire_bytes += send.bytes;
  // What the peer holds after this sync, if it succeeds: this sync's bytes.
  if (keep) delta.snapshots->Keep(delta.digest, send.peer, round, std::string(run.sync_id), chunk, bytes);
  stats.encode_seconds += absl::ToDoubleSeconds(absl::Now() - start);
}

absl::Status RoundEngine::RunRound(const RunInputs& run, const planner::Stage& stage, int32_t round, Tally& tally) {
  const planner::Plan& plan = run.plan;
  ExecutionStats& stats = tally.stats;
  const int32_t number = stage.first_round + round;  // the transport's, the same at both ends
  const int slot = number % planner::kStagingSlots;
  std::vector<SendOp> sends;
  std::vector<RecvOp> receives;
  std::vector<std::pair<std::vector<planner::ChunkPart>, uint8_t*>> to_unpack;
  tally.staged.swap(tally.staged_before);
  for (auto& [peer, bytes] : tally.staged) bytes = 0;
  for (const planner::PeerStream& stream : stage.receives) {
    if (round >= static_cast<int32_t>(stream.chunks.size()) || run.direct.Has(stream.peer)) continue;
    const planner::Chunk& chunk = stream.chunks[round];
    std::vector<planner::ChunkPart> parts = planner::ChunkParts(plan, stream, chunk);
    uint8_t* into = UnstagedAddress(plan, parts, run.buffers, /*source=*/false);
    const bool baseline = run.delta != nullptr && run.delta->senders.count(stream.peer) > 0;
    if (into == nullptr) {
      SHARDSYNC_ASSIGN_OR_RETURN(into, device_.Staging(stream.peer, /*send=*/false, slot, tally.slot_bytes));
      if (baseline) {  // an unstaged receive lands on its targets, which are the baseline
        const absl::Time start = absl::Now();
        SHARDSYNC_RETURN_IF_ERROR(device_.Gather(plan, parts, run.buffers, into, slot));
        stats.baseline_seconds += absl::ToDoubleSeconds(absl::Now() - start);
      }
      to_unpack.emplace_back(std::move(parts), into);
      tally.staged[stream.peer] += chunk.bytes;
    }
    receives.push_back(RecvOp{stream.peer, into, chunk.bytes, baseline, baseline ? &tally.apply_nanos : nullptr});
  }
  std::deque<std::string> encoded;  // the round's deltas, alive until it is sent
  for (const planner::PeerStream& stream : stage.sends) {
    if (round >= static_cast<int32_t>(stream.chunks.size()) || run.direct.Has(stream.peer)) continue;
    const planner::Chunk& chunk = stream.chunks[round];
    const std::vector<planner::ChunkPart> parts = planner::ChunkParts(plan, stream, chunk);
    const uint8_t* from = UnstagedAddress(plan, parts, run.buffers, /*source=*/true);
    if (from == nullptr) {
      SHARDSYNC_ASSIGN_OR_RETURN(auto staging, device_.Staging(stream.peer, /*send=*/true, slot, tally.slot_bytes));
      SHARDSYNC_RETURN_IF_ERROR(device_.Pack(plan, parts, run.buffers, staging, slot));
      from = staging;
      tally.staged[stream.peer] += chunk.bytes;
    }
    sends.push_back(SendOp{stream.peer, from, chunk.bytes});
    if (run.delta != nullptr) SendAsDelta(run, number, sends.back(), encoded, stats);
    stats.wire_bytes += sends.back().bytes;
    stats.sent_bytes += chunk.bytes;
    stats.staged_sent_bytes += chunk.bytes;
    ++stats.chunks;
  }
  int64_t in_use = 0;
  for (const auto& [peer, bytes] : tally.staged) {
    in_use += bytes;
    stats.peak_peer_staging_bytes = std::max(stats.peak_peer_staging_bytes, bytes + tally.staged_before[peer]);
  }
  stats.peak_staging_bytes = std::max(stats.peak_staging_bytes, in_use + tally.in_use_before);
  tally.in_use_before = in_use;
  if (sends.empty() && receives.empty()) return absl::OkStatus();  // every stream idle or direct
  SHARDSYNC_RETURN_IF_ERROR(device_.BeforeTransfer(slot));
  SHARDSYNC_RETURN_IF_ERROR(transport_.RunRound(run.sync_id, number, sends, receives, run.deadline));
  SHARDSYNC_RETURN_IF_ERROR(device_.AfterTransfer(slot));
  for (const auto& [parts, staging] : to_unpack) {
    SHARDSYNC_RETURN_IF_ERROR(device_.Unpack(plan, parts, staging, run.buffers, slot));
  }
  for (const RecvOp& r : receives) stats.received_bytes += r.bytes;
  stats.chunks += static_cast<int64_t>(receives.size());
  ++stats.rounds;
  tally.Progressed();
  return absl::OkStatus();
}

}  // namespace shardsync::executor
