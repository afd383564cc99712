#include "executor/round_engine.h"

#include "executor/host_copy.h"

namespace shardsync::executor {
namespace {

// A chunk that is one contiguous run on `source`'s side moves without staging; returns
// where it starts, or nullptr.
uint8_t* DirectAddress(const planner::Plan& plan, const planner::PeerStream& stream, const planner::Chunk& chunk,
                       const BufferTable& buffers, bool source) {
  if (chunk.first != chunk.last) return nullptr;
  const planner::Segment& s = plan.segments[stream.segments[chunk.first]];
  if (s.src_dtype != s.dst_dtype || !IsContiguousRange(s, chunk.first_begin, chunk.last_end, source)) return nullptr;
  int64_t offset = source ? s.src_base : s.dst_base;
  int64_t rest = chunk.first_begin;
  for (int k = s.axes - 1; k >= 0; --k) {
    offset += (rest % s.shape[k]) * (source ? s.src_strides[k] : s.dst_strides[k]);
    rest /= s.shape[k];
  }
  uint8_t* base = buffers[(source ? s.src : s.dst).buffer];
  return base + offset * planner::ElementBytes(s.dst_dtype);
}

}  // namespace

absl::StatusOr<ExecutionStats> RoundEngine::Run(absl::string_view sync_id, const planner::Plan& plan,
                                                const planner::Schedule& schedule, const BufferTable& buffers,
                                                int64_t staging_bytes, absl::Time deadline,
                                                ExecutionProgress* progress) {
  const absl::Time start = absl::Now();
  ExecutionStats stats;
  ExecutionProgress unused;
  if (progress == nullptr) progress = &unused;
  int64_t total = 0;
  for (int32_t index : schedule.local_segments) total += planner::SegmentBytes(plan.segments[index]);
  for (const auto* streams : {&schedule.sends, &schedule.receives}) {
    for (const planner::PeerStream& stream : *streams) total += stream.bytes;
  }
  progress->bytes_total = total;
  progress->rounds_total = schedule.rounds;
  progress->bytes_done = 0;
  progress->rounds_done = 0;
  if (auto s = device_.CopyLocal(plan, schedule.local_segments, schedule.fills, buffers); !s.ok()) return s;
  for (int32_t index : schedule.local_segments) stats.local_bytes += planner::SegmentBytes(plan.segments[index]);
  for (int32_t index : schedule.fills) {
    const planner::FillOp& f = plan.fills[index];
    stats.fill_bytes += planner::NumElements(f.fill.shape) * planner::ElementBytes(f.dtype);
  }

  std::vector<SendOp> sends;
  std::vector<RecvOp> receives;
  std::vector<std::pair<const planner::PeerStream*, uint8_t*>> to_unpack;
  for (int32_t round = 0; round < schedule.rounds; ++round) {
    sends.clear();
    receives.clear();
    to_unpack.clear();
    int64_t staging_in_use = 0;
    for (const planner::PeerStream& stream : schedule.receives) {
      if (round >= static_cast<int32_t>(stream.chunks.size())) continue;
      const planner::Chunk& chunk = stream.chunks[round];
      uint8_t* into = DirectAddress(plan, stream, chunk, buffers, /*source=*/false);
      if (into == nullptr) {
        auto staging = device_.Staging(stream.peer, /*send=*/false, staging_bytes);
        if (!staging.ok()) return staging.status();
        into = *staging;
        to_unpack.emplace_back(&stream, into);
        staging_in_use += chunk.bytes;
        stats.peak_peer_staging_bytes = std::max(stats.peak_peer_staging_bytes, chunk.bytes);
      }
      receives.push_back(RecvOp{stream.peer, into, chunk.bytes});
    }
    for (const planner::PeerStream& stream : schedule.sends) {
      if (round >= static_cast<int32_t>(stream.chunks.size())) continue;
      const planner::Chunk& chunk = stream.chunks[round];
      const uint8_t* from = DirectAddress(plan, stream, chunk, buffers, /*source=*/true);
      if (from == nullptr) {
        auto staging = device_.Staging(stream.peer, /*send=*/true, staging_bytes);
        if (!staging.ok()) return staging.status();
        const std::vector<planner::ChunkPart> parts = planner::ChunkParts(plan, stream, chunk);
        if (auto s = device_.Pack(plan, parts, buffers, *staging); !s.ok()) return s;
        from = *staging;
        staging_in_use += chunk.bytes;
        stats.peak_peer_staging_bytes = std::max(stats.peak_peer_staging_bytes, chunk.bytes);
      }
      sends.push_back(SendOp{stream.peer, from, chunk.bytes});
      stats.sent_bytes += chunk.bytes;
      ++stats.chunks;
    }
    stats.peak_staging_bytes = std::max(stats.peak_staging_bytes, staging_in_use);
    if (auto status = transport_.RunRound(sync_id, round, sends, receives, deadline); !status.ok()) return status;
    for (const auto& [stream, staging] : to_unpack) {
      const std::vector<planner::ChunkPart> parts = planner::ChunkParts(plan, *stream, stream->chunks[round]);
      if (auto s = device_.Unpack(plan, parts, staging, buffers); !s.ok()) return s;
    }
    for (const RecvOp& r : receives) stats.received_bytes += r.bytes;
    stats.chunks += static_cast<int64_t>(receives.size());
    ++stats.rounds;
    progress->bytes_done = stats.local_bytes + stats.sent_bytes + stats.received_bytes;
    progress->rounds_done = stats.rounds;
  }
  if (auto s = transport_.Finish(deadline); !s.ok()) return s;
  if (auto s = device_.Synchronize(); !s.ok()) return s;
  const absl::StatusOr<double> local_seconds = device_.LastLocalSeconds();
  if (!local_seconds.ok()) return local_seconds.status();
  stats.local_seconds = *local_seconds;
  progress->bytes_done = stats.local_bytes + stats.sent_bytes + stats.received_bytes;
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

}  // namespace shardsync::executor
