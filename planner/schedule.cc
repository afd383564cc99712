#include "planner/schedule.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

namespace shardsync::planner {
namespace {

// Cuts a stream into chunks of at most `budget` bytes; a segment larger than what is
// left of a chunk is split at an element (outer axes included).
absl::Status CutChunks(const Plan& plan, int64_t budget, PeerStream& stream) {
  Chunk chunk;
  for (int32_t index : stream.segments) {
    const Segment& s = plan.segments[index];
    const int64_t element = ElementBytes(s.dst_dtype);
    if (element > budget) {
      return absl::InvalidArgumentError(absl::StrCat("staging budget of ", budget, " bytes is smaller than one ",
                                                     DTypeName(s.dst_dtype), " element of tensor '",
                                                     plan.tensor_names[s.tensor], "'"));
    }
    const int64_t total = SegmentElements(s);
    stream.bytes += total * element;
    for (int64_t at = 0; at < total;) {
      int64_t room = (budget - chunk.bytes) / element;
      if (room == 0) {
        stream.chunks.push_back(std::move(chunk));
        chunk = Chunk{};
        room = budget / element;
      }
      const int64_t take = std::min(room, total - at);
      chunk.parts.push_back(ChunkPart{index, at, at + take});
      chunk.bytes += take * element;
      at += take;
    }
  }
  if (!chunk.parts.empty()) stream.chunks.push_back(std::move(chunk));
  return absl::OkStatus();
}

PeerStream& StreamFor(std::map<int32_t, PeerStream>& streams, int32_t peer) {
  PeerStream& stream = streams[peer];
  stream.peer = peer;
  return stream;
}

}  // namespace

absl::StatusOr<std::vector<Schedule>> MakeSchedules(const Plan& plan, int64_t staging_bytes) {
  if (staging_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("staging budget must be positive, got ", staging_bytes));
  }
  std::vector<Schedule> schedules(plan.num_ranks);
  std::vector<std::map<int32_t, PeerStream>> sends(plan.num_ranks), receives(plan.num_ranks);
  for (size_t i = 0; i < plan.segments.size(); ++i) {
    const Segment& s = plan.segments[i];
    const int32_t index = static_cast<int32_t>(i);
    if (s.src.rank == s.dst.rank) {
      schedules[s.src.rank].local_segments.push_back(index);
      continue;
    }
    StreamFor(sends[s.src.rank], s.dst.rank).segments.push_back(index);
    StreamFor(receives[s.dst.rank], s.src.rank).segments.push_back(index);
  }
  for (size_t i = 0; i < plan.fills.size(); ++i) {
    schedules[plan.fills[i].fill.holder.rank].fills.push_back(static_cast<int32_t>(i));
  }
  for (int32_t r = 0; r < plan.num_ranks; ++r) {
    Schedule& schedule = schedules[r];
    schedule.rank = r;
    for (auto* side : {&sends[r], &receives[r]}) {
      auto& out = side == &sends[r] ? schedule.sends : schedule.receives;
      for (auto& [peer, stream] : *side) {
        if (auto s = CutChunks(plan, staging_bytes, stream); !s.ok()) return s;
        schedule.rounds = std::max<int32_t>(schedule.rounds, static_cast<int32_t>(stream.chunks.size()));
        out.push_back(std::move(stream));
      }
    }
  }
  return schedules;
}

}  // namespace shardsync::planner
