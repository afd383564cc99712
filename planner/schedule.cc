#include "planner/schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardsync::planner {
namespace {

// Cuts a stream into chunks of at most MaxChunkBytes(staging_bytes); a segment larger
// than what is left of a chunk is split at an element (outer axes included).
absl::Status CutChunks(const Plan& plan, int64_t staging_bytes, PeerStream& stream) {
  const int64_t budget = MaxChunkBytes(staging_bytes);
  Chunk chunk;
  bool open = false;
  for (int32_t position = 0; position < static_cast<int32_t>(stream.segments.size()); ++position) {
    const Segment& s = plan.segments[stream.segments[position]];
    const int64_t element = ElementBytes(s.dst_dtype);
    if (element > budget) {
      return absl::InvalidArgumentError(absl::StrCat("staging budget of ", staging_bytes, " bytes (",
                                                     kStagingBuffersPerPeer, " slots of ", budget,
                                                     ") cannot hold one ", DTypeName(s.dst_dtype),
                                                     " element of tensor '", plan.tensor_names[s.tensor], "' per slot"));
    }
    const int64_t total = SegmentElements(s);
    stream.bytes += total * element;
    for (int64_t at = 0; at < total;) {
      int64_t room = (budget - chunk.bytes) / element;
      if (open && room == 0) {
        stream.chunks.push_back(chunk);
        open = false;
      }
      if (!open) {
        chunk = Chunk{position, position, at, at, 0};
        open = true;
        room = budget / element;
      }
      const int64_t take = std::min(room, total - at);
      chunk.last = position;
      chunk.last_end = at + take;
      chunk.bytes += take * element;
      at += take;
    }
  }
  if (open) stream.chunks.push_back(chunk);
  return absl::OkStatus();
}

// Groups (peer, segment) pairs by ascending peer, keeping segment order within a peer.
std::vector<PeerStream> GroupByPeer(const std::vector<std::pair<int32_t, int32_t>>& pairs,
                                    std::vector<int32_t>& stream_of_peer) {
  std::vector<PeerStream> streams;
  std::vector<int32_t> peers;
  for (const auto& [peer, segment] : pairs) {
    if (stream_of_peer[peer] < 0) {
      stream_of_peer[peer] = static_cast<int32_t>(peers.size());
      peers.push_back(peer);
    }
  }
  std::sort(peers.begin(), peers.end());
  for (size_t i = 0; i < peers.size(); ++i) stream_of_peer[peers[i]] = static_cast<int32_t>(i);
  streams.resize(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) streams[i].peer = peers[i];
  for (const auto& [peer, segment] : pairs) streams[stream_of_peer[peer]].segments.push_back(segment);
  for (int32_t peer : peers) stream_of_peer[peer] = -1;  // ready for the next rank
  return streams;
}

}  // namespace

std::vector<ChunkPart> ChunkParts(const Plan& plan, const PeerStream& stream, const Chunk& chunk) {
  std::vector<ChunkPart> parts;
  for (int32_t position = chunk.first; position <= chunk.last; ++position) {
    const int32_t segment = stream.segments[position];
    const int64_t begin = position == chunk.first ? chunk.first_begin : 0;
    const int64_t end = position == chunk.last ? chunk.last_end : SegmentElements(plan.segments[segment]);
    parts.push_back(ChunkPart{segment, begin, end});
  }
  return parts;
}

int32_t Schedule::rounds() const {
  int32_t total = 0;
  for (const Stage& stage : stages) total += stage.rounds;
  return total;
}

absl::Status CheckChunks(const Plan& plan, const Schedule& schedule, int64_t staging_bytes) {
  for (size_t k = 0; k < schedule.stages.size(); ++k) {
    const Stage& stage = schedule.stages[k];
    for (int32_t index : stage.local_segments) {
      if (plan.segments[index].stage != static_cast<int8_t>(k)) {
        return absl::InvalidArgumentError(absl::StrCat("a local copy of stage ", plan.segments[index].stage,
                                                       " is listed in stage ", k));
      }
    }
    for (const auto* streams : {&stage.sends, &stage.receives}) {
      for (const PeerStream& stream : *streams) {
        if (static_cast<int64_t>(stream.chunks.size()) > stage.rounds) {
          return absl::InvalidArgumentError(absl::StrCat("the stream with rank ", stream.peer, " has more chunks than ",
                                                         stage.rounds, " rounds"));
        }
        for (int32_t index : stream.segments) {
          if (plan.segments[index].stage != static_cast<int8_t>(k)) {
            return absl::InvalidArgumentError(absl::StrCat("the stream with rank ", stream.peer, " of stage ", k,
                                                           " holds a segment of stage ", plan.segments[index].stage));
          }
        }
        for (const Chunk& chunk : stream.chunks) {
          int64_t bytes = 0;
          for (const ChunkPart& part : ChunkParts(plan, stream, chunk)) {
            if (part.end <= part.begin) {
              return absl::InvalidArgumentError(absl::StrCat("a chunk with rank ", stream.peer, " has an empty part"));
            }
            bytes += (part.end - part.begin) * ElementBytes(plan.segments[part.segment].dst_dtype);
          }
          if (bytes != chunk.bytes || bytes > MaxChunkBytes(staging_bytes)) {
            return absl::InvalidArgumentError(absl::StrCat("a chunk with rank ", stream.peer, " says ", chunk.bytes,
                                                           " bytes, holds ", bytes, ", and a staging slot holds ",
                                                           MaxChunkBytes(staging_bytes)));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Schedule>> MakeSchedules(const Plan& plan, int64_t staging_bytes) {
  if (staging_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("staging budget must be positive, got ", staging_bytes));
  }
  std::vector<Schedule> schedules(plan.num_ranks);
  for (int32_t r = 0; r < plan.num_ranks; ++r) {
    schedules[r].rank = r;
    schedules[r].stages.resize(plan.stages);
  }
  for (size_t i = 0; i < plan.fills.size(); ++i) {
    schedules[plan.fills[i].fill.holder.rank].fills.push_back(static_cast<int32_t>(i));
  }
  std::vector<int32_t> stream_of_peer(plan.num_ranks, -1);
  int32_t first_round = 0;
  for (int32_t k = 0; k < plan.stages; ++k) {
    // Per rank, (peer, segment) in plan order: the order both ends derive their streams from.
    std::vector<std::vector<std::pair<int32_t, int32_t>>> sends(plan.num_ranks), receives(plan.num_ranks);
    for (size_t i = 0; i < plan.segments.size(); ++i) {
      const Segment& s = plan.segments[i];
      if (s.stage != k) continue;
      const int32_t index = static_cast<int32_t>(i);
      if (s.src.rank == s.dst.rank) {
        schedules[s.src.rank].stages[k].local_segments.push_back(index);
        continue;
      }
      sends[s.src.rank].emplace_back(s.dst.rank, index);
      receives[s.dst.rank].emplace_back(s.src.rank, index);
    }
    int32_t most_rounds = 0;
    for (int32_t r = 0; r < plan.num_ranks; ++r) {
      Stage& stage = schedules[r].stages[k];
      stage.first_round = first_round;
      stage.sends = GroupByPeer(sends[r], stream_of_peer);
      stage.receives = GroupByPeer(receives[r], stream_of_peer);
      std::vector<std::pair<int32_t, int32_t>>().swap(sends[r]);
      std::vector<std::pair<int32_t, int32_t>>().swap(receives[r]);
      for (auto* streams : {&stage.sends, &stage.receives}) {
        for (PeerStream& stream : *streams) {
          if (auto s = CutChunks(plan, staging_bytes, stream); !s.ok()) return s;
          stage.rounds = std::max<int32_t>(stage.rounds, static_cast<int32_t>(stream.chunks.size()));
        }
      }
      most_rounds = std::max(most_rounds, stage.rounds);
    }
    first_round += most_rounds;
  }
  return schedules;
}

}  // namespace shardsync::planner
