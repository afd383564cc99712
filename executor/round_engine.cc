#include "executor/round_engine.h"

#include "executor/host_copy.h"

namespace shardsync::executor {
namespace {

// On a transport that takes many operations per peer (NCCL), a part at least this big
// is its own operation, straight between source and target memory where its side is
// contiguous. Both ends decide by size alone, so their operations pair up.
constexpr int64_t kDirectPartBytes = 1 << 20;

// Where elements [begin, end) of a segment start on one side, if they are back to back
// there (and need no conversion); else nullptr.
uint8_t* DirectAddress(const planner::Segment& s, int64_t begin, int64_t end, const BufferTable& buffers,
                       bool source) {
  if (s.src_dtype != s.dst_dtype || !IsContiguousRange(s, begin, end, source)) return nullptr;
  int64_t offset = source ? s.src_base : s.dst_base;
  int64_t rest = begin;
  for (int k = s.axes - 1; k >= 0; --k) {
    offset += (rest % s.shape[k]) * (source ? s.src_strides[k] : s.dst_strides[k]);
    rest /= s.shape[k];
  }
  return buffers[(source ? s.src : s.dst).buffer] + offset * planner::ElementBytes(s.dst_dtype);
}

int64_t PartBytes(const planner::Plan& plan, const planner::ChunkPart& part) {
  return (part.end - part.begin) * planner::ElementBytes(plan.segments[part.segment].dst_dtype);
}

// A chunk's operations with one peer: each big part alone (when the transport takes
// several per peer), the rest packed together. `staged` parts go through staging.
struct Operation {
  std::vector<planner::ChunkPart> parts;
  int64_t bytes = 0;
};

std::vector<Operation> SplitChunk(const planner::Plan& plan, const std::vector<planner::ChunkPart>& parts,
                                  bool many_per_peer) {
  std::vector<Operation> operations;
  Operation rest;
  for (const planner::ChunkPart& part : parts) {
    const int64_t bytes = PartBytes(plan, part);
    if (many_per_peer && bytes >= kDirectPartBytes) {
      operations.push_back(Operation{{part}, bytes});
    } else {
      rest.parts.push_back(part);
      rest.bytes += bytes;
    }
  }
  if (!rest.parts.empty()) operations.push_back(std::move(rest));
  return operations;
}

}  // namespace

absl::StatusOr<ExecutionStats> RoundEngine::Run(absl::string_view sync_id, const planner::Plan& plan,
                                                const planner::Schedule& schedule, const BufferTable& buffers,
                                                int64_t staging_bytes, absl::Time deadline) {
  const absl::Time start = absl::Now();
  ExecutionStats stats;
  if (auto s = device_.CopyLocal(plan, schedule.local_segments, schedule.fills, buffers); !s.ok()) return s;
  for (int32_t index : schedule.local_segments) stats.local_bytes += planner::SegmentBytes(plan.segments[index]);
  for (int32_t index : schedule.fills) {
    const planner::FillOp& f = plan.fills[index];
    stats.fill_bytes += planner::NumElements(f.fill.shape) * planner::ElementBytes(f.dtype);
  }

  std::vector<SendOp> sends;
  std::vector<RecvOp> receives;
  // Staged receives to unpack after the round: (parts, where they landed).
  std::vector<std::pair<std::vector<planner::ChunkPart>, uint8_t*>> to_unpack;
  const bool many_per_peer = transport_.device_memory();
  for (int32_t round = 0; round < schedule.rounds; ++round) {
    sends.clear();
    receives.clear();
    to_unpack.clear();
    int64_t staging_in_use = 0;
    for (const planner::PeerStream& stream : schedule.receives) {
      if (round >= static_cast<int32_t>(stream.chunks.size())) continue;
      const planner::Chunk& chunk = stream.chunks[round];
      uint8_t* staging = nullptr;
      int64_t staged = 0;
      for (Operation& op : SplitChunk(plan, planner::ChunkParts(plan, stream, chunk), many_per_peer)) {
        const planner::ChunkPart& first = op.parts.front();
        uint8_t* into = op.parts.size() == 1 ? DirectAddress(plan.segments[first.segment], first.begin, first.end,
                                                             buffers, /*source=*/false)
                                             : nullptr;
        if (into == nullptr) {
          if (staging == nullptr) {
            auto allocated = device_.Staging(stream.peer, /*send=*/false, staging_bytes);
            if (!allocated.ok()) return allocated.status();
            staging = *allocated;
          }
          into = staging + staged;
          staged += op.bytes;
          to_unpack.emplace_back(std::move(op.parts), into);
        }
        receives.push_back(RecvOp{stream.peer, into, op.bytes});
      }
      staging_in_use += staged;
      stats.peak_peer_staging_bytes = std::max(stats.peak_peer_staging_bytes, staged);
      stats.received_bytes += chunk.bytes;
      ++stats.chunks;
    }
    for (const planner::PeerStream& stream : schedule.sends) {
      if (round >= static_cast<int32_t>(stream.chunks.size())) continue;
      const planner::Chunk& chunk = stream.chunks[round];
      uint8_t* staging = nullptr;
      int64_t staged = 0;
      for (const Operation& op : SplitChunk(plan, planner::ChunkParts(plan, stream, chunk), many_per_peer)) {
        const planner::ChunkPart& first = op.parts.front();
        const uint8_t* from = op.parts.size() == 1 ? DirectAddress(plan.segments[first.segment], first.begin,
                                                                   first.end, buffers, /*source=*/true)
                                                   : nullptr;
        if (from == nullptr) {
          if (staging == nullptr) {
            auto allocated = device_.Staging(stream.peer, /*send=*/true, staging_bytes);
            if (!allocated.ok()) return allocated.status();
            staging = *allocated;
          }
          if (auto s = device_.Pack(plan, op.parts, buffers, staging + staged); !s.ok()) return s;
          from = staging + staged;
          staged += op.bytes;
        }
        sends.push_back(SendOp{stream.peer, from, op.bytes});
      }
      staging_in_use += staged;
      stats.peak_peer_staging_bytes = std::max(stats.peak_peer_staging_bytes, staged);
      stats.sent_bytes += chunk.bytes;
      ++stats.chunks;
    }
    stats.peak_staging_bytes = std::max(stats.peak_staging_bytes, staging_in_use);
    if (auto status = transport_.RunRound(sync_id, round, sends, receives, deadline); !status.ok()) return status;
    for (const auto& [parts, landed] : to_unpack) {
      if (auto s = device_.Unpack(plan, parts, landed, buffers); !s.ok()) return s;
    }
    ++stats.rounds;
  }
  if (auto s = device_.Synchronize(); !s.ok()) return s;
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

}  // namespace shardsync::executor
