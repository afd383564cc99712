#include "planner/schedule.h"

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardsync::planner {
namespace {

// Cuts one stream into chunks of at most a budget of bytes as its segments arrive in
// plan order; a segment larger than what is left of a chunk is split at an element
// (outer axes included). Chunks that close go to `chunks`, or are only counted when it
// is null.
class ChunkCutter {
 public:
  explicit ChunkCutter(int64_t budget) : budget_(budget) {}

  // A segment of `total` elements of `element` bytes, at `position` of its stream.
  void Add(int32_t position, int64_t total, int64_t element, std::vector<Chunk>* chunks) {
    for (int64_t at = 0; at < total;) {
      int64_t room = (budget_ - chunk_.bytes) / element;
      if (open_ && room == 0) Close(chunks);
      if (!open_) {
        chunk_ = Chunk{position, position, at, at, 0};
        open_ = true;
        room = budget_ / element;
      }
      const int64_t take = std::min(room, total - at);
      chunk_.last = position;
      chunk_.last_end = at + take;
      chunk_.bytes += take * element;
      at += take;
    }
  }
  void Finish(std::vector<Chunk>* chunks) {
    if (open_) Close(chunks);
  }
  int64_t chunks() const { return closed_; }

 private:
  void Close(std::vector<Chunk>* chunks) {
    if (chunks != nullptr) chunks->push_back(chunk_);
    ++closed_;
    open_ = false;
  }

  int64_t budget_;
  Chunk chunk_;
  bool open_ = false;
  int64_t closed_ = 0;
};

// What MakeSchedules checks of a segment before it goes on a link: one element fits a
// slot, and the plan so far fits kMaxChunksPerPlan chunks.
class LinkBudget {
 public:
  explicit LinkBudget(int64_t staging_bytes)
      : staging_bytes_(staging_bytes),
        budget_(MaxChunkBytes(staging_bytes)),
        most_bytes_(static_cast<__int128>(kMaxChunksPerPlan) * std::max<int64_t>(budget_, 1)) {}

  int64_t budget() const { return budget_; }
  // The segment's element size in bytes, once checked.
  absl::StatusOr<int64_t> Add(const Segment& s, absl::string_view tensor_name) {
    const int64_t element = ElementBytes(s.dst_dtype);
    if (element > budget_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "staging budget of ", staging_bytes_, " bytes (", kStagingBuffersPerPeer, " slots of ", budget_,
          ") cannot hold one ", DTypeName(s.dst_dtype), " element of tensor '", tensor_name, "' per slot"));
    }
    // Chunks are at least bytes / budget: more bytes than this make too many.
    link_bytes_ += static_cast<__int128>(SegmentElements(s)) * element;
    if (link_bytes_ > most_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat("a staging budget of ", staging_bytes_,
                                                       " bytes per peer cuts this plan into more than ",
                                                       kMaxChunksPerPlan, " chunks; raise the staging budget"));
    }
    return element;
  }

 private:
  int64_t staging_bytes_;
  int64_t budget_;
  __int128 most_bytes_;
  __int128 link_bytes_ = 0;
};

// The stream from one rank to another, built once and given to both ends.
struct LinkStream {
  int32_t from = 0;
  PeerStream stream;  // stream.peer: the receiving rank
  ChunkCutter cutter;
};

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
        return absl::InvalidArgumentError(
            absl::StrCat("a local copy of stage ", plan.segments[index].stage, " is listed in stage ", k));
      }
    }
    for (int32_t index : stage.quantizes) {
      const QuantizeOp& q = plan.quantizes[index];
      if (q.stage != static_cast<int8_t>(k) || q.target.rank != schedule.rank) {
        return absl::InvalidArgumentError(absl::StrCat("a quantize of stage ", q.stage, " on rank ", q.target.rank,
                                                       " is listed in stage ", k, " of rank ", schedule.rank));
      }
    }
    for (const auto* streams : {&stage.sends, &stage.receives}) {
      for (const PeerStream& stream : *streams) {
        if (static_cast<int64_t>(stream.chunks.size()) > stage.rounds) {
          return absl::InvalidArgumentError(
              absl::StrCat("the stream with rank ", stream.peer, " has more chunks than ", stage.rounds, " rounds"));
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

struct RoundCounter::Links {
  explicit Links(int64_t staging_bytes) : budget(staging_bytes) {}
  LinkBudget budget;
  struct Link {
    explicit Link(int64_t budget) : cutter(budget) {}
    ChunkCutter cutter;
    int64_t bytes = 0;
  };
  // By stage, by receiver, by sender: a target's pieces come one after another, so the
  // small table of one receiver stays in cache (one table of all pairs did not).
  std::vector<std::vector<absl::flat_hash_map<int32_t, Link>>> links;
  // The link of (last_stage, last_pair): consecutive pieces mostly share it.
  Link* last = nullptr;
  int8_t last_stage = -1;
  uint64_t last_pair = 0;
};

RoundCounter::RoundCounter(int32_t num_ranks, int64_t staging_bytes, std::vector<std::string> tensor_names)
    : num_ranks_(num_ranks), tensor_names_(std::move(tensor_names)), links_(std::make_unique<Links>(staging_bytes)) {}

RoundCounter::~RoundCounter() = default;

absl::Status RoundCounter::Add(absl::Span<const Segment> segments) {
  Links& l = *links_;
  for (const Segment& s : segments) {
    if (s.src.rank == s.dst.rank) continue;
    SHARDSYNC_ASSIGN_OR_RETURN(const int64_t element, l.budget.Add(s, tensor_names_.at(s.tensor)));
    const uint64_t pair = (static_cast<uint64_t>(s.src.rank) << 32) | static_cast<uint32_t>(s.dst.rank);
    if (l.last == nullptr || pair != l.last_pair || s.stage != l.last_stage) {
      while (static_cast<int32_t>(l.links.size()) <= s.stage) l.links.emplace_back(num_ranks_);
      l.last = &l.links[s.stage][s.dst.rank].try_emplace(s.src.rank, l.budget.budget()).first->second;
      l.last_pair = pair;
      l.last_stage = s.stage;
    }
    const int64_t elements = SegmentElements(s);
    l.last->cutter.Add(0, elements, element, nullptr);
    l.last->bytes += elements * element;
  }
  return absl::OkStatus();
}

std::vector<int32_t> FirstRounds(const std::vector<std::vector<int32_t>>& rounds) {
  std::vector<int32_t> first_rounds;
  int32_t first_round = 0;
  for (const std::vector<int32_t>& stage : rounds) {
    first_rounds.push_back(first_round);
    first_round += stage.empty() ? 0 : *std::max_element(stage.begin(), stage.end());
  }
  return first_rounds;
}

RoundCounts RoundCounter::Finish(int32_t stages) {
  RoundCounts counts;
  counts.chunks.assign(num_ranks_, 0);
  for (int32_t k = 0; k < stages; ++k) {
    std::vector<int32_t>& rounds = counts.rounds.emplace_back(num_ranks_, 0);
    if (k >= static_cast<int32_t>(links_->links.size())) continue;
    for (int32_t to = 0; to < num_ranks_; ++to) {
      for (auto& [from, link] : links_->links[k][to]) {
        link.cutter.Finish(nullptr);
        counts.link_bytes[{from, to}] += link.bytes;
        const int32_t chunks = static_cast<int32_t>(link.cutter.chunks());
        for (int32_t rank : {from, to}) {
          rounds[rank] = std::max(rounds[rank], chunks);
          counts.chunks[rank] += chunks;
        }
        counts.link_chunks += chunks;
      }
    }
  }
  counts.first_rounds = FirstRounds(counts.rounds);
  links_ = std::make_unique<Links>(0);
  return counts;
}

namespace {

// The schedules of every rank of `plan` (`only_rank` none) or of `only_rank` alone (the
// one schedule returned), from `segments` read in place of the plan's own. Stages'
// first rounds are left zero: they come from every rank's rounds.
absl::StatusOr<std::vector<Schedule>> SchedulesOf(const Plan& plan, const BlockVector<Segment>& segments,
                                                  int64_t staging_bytes, std::optional<int32_t> only_rank) {
  if (staging_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("staging budget must be positive, got ", staging_bytes));
  }
  if (only_rank && (*only_rank < 0 || *only_rank >= plan.num_ranks)) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", *only_rank, " is outside a plan of ", plan.num_ranks));
  }
  std::vector<Schedule> schedules(only_rank ? 1 : plan.num_ranks);
  for (size_t r = 0; r < schedules.size(); ++r) {
    schedules[r].rank = only_rank ? *only_rank : static_cast<int32_t>(r);
    schedules[r].stages.resize(plan.stages);
  }
  // Where `rank`'s schedule is made: nowhere for the ranks not asked for.
  const auto schedule_of = [&](int32_t rank) -> Schedule* {
    if (!only_rank) return &schedules[rank];
    return rank == *only_rank ? &schedules[0] : nullptr;
  };
  for (size_t i = 0; i < plan.fills.size(); ++i) {
    if (Schedule* schedule = schedule_of(plan.fills[i].fill.holder.rank)) {
      schedule->fills.push_back(static_cast<int32_t>(i));
    }
  }
  LinkBudget budget(staging_bytes);
  for (int32_t k = 0; k < plan.stages; ++k) {
    // One pass in plan order, the order both ends derive their streams from; each
    // segment is read once, where it lies (a rank's segments are spread over the plan).
    // Links by receiver, then sender: a target's pieces come one after another, so the
    // small table of one receiver stays in cache (one table of all pairs did not).
    std::vector<LinkStream> links;
    std::vector<absl::flat_hash_map<int32_t, int32_t>> link_from(plan.num_ranks);
    uint64_t last_pair = ~uint64_t{0};
    int32_t last_link = -1;
    for (size_t i = 0; i < segments.size(); ++i) {
      const Segment& s = segments[i];
      if (s.stage != k) continue;
      const int32_t index = static_cast<int32_t>(i);
      if (s.src.rank == s.dst.rank) {
        if (Schedule* schedule = schedule_of(s.src.rank)) schedule->stages[k].local_segments.push_back(index);
        continue;
      }
      SHARDSYNC_ASSIGN_OR_RETURN(const int64_t element, budget.Add(s, plan.tensor_names[s.tensor]));
      const uint64_t pair = (static_cast<uint64_t>(s.src.rank) << 32) | static_cast<uint32_t>(s.dst.rank);
      if (pair != last_pair) {
        const auto [it, added] = link_from[s.dst.rank].emplace(s.src.rank, static_cast<int32_t>(links.size()));
        if (added) {
          links.push_back(LinkStream{s.src.rank, PeerStream{s.dst.rank, {}, {}, 0}, ChunkCutter(budget.budget())});
        }
        last_pair = pair;
        last_link = it->second;
      }
      PeerStream& stream = links[last_link].stream;
      const int64_t elements = SegmentElements(s);
      links[last_link].cutter.Add(static_cast<int32_t>(stream.segments.size()), elements, element, &stream.chunks);
      stream.segments.push_back(index);
      stream.bytes += elements * element;
    }
    // Each rank's sends and receives by ascending peer: links sorted by (from, to) for
    // the senders, by (to, from) for the receivers (on packed keys, not the links).
    for (LinkStream& link : links) link.cutter.Finish(&link.stream.chunks);
    std::vector<std::pair<uint64_t, int32_t>> order(links.size());
    const auto sort_by = [&](bool sender) {
      for (size_t i = 0; i < links.size(); ++i) {
        const uint32_t from = static_cast<uint32_t>(links[i].from), to = static_cast<uint32_t>(links[i].stream.peer);
        order[i] = {sender ? (uint64_t{from} << 32 | to) : (uint64_t{to} << 32 | from), static_cast<int32_t>(i)};
      }
      std::sort(order.begin(), order.end());
    };
    sort_by(false);
    for (const auto& [key, i] : order) {
      Schedule* receiver = schedule_of(links[i].stream.peer);
      if (receiver == nullptr) continue;
      PeerStream received = links[i].stream;
      received.peer = links[i].from;
      receiver->stages[k].receives.push_back(std::move(received));
    }
    sort_by(true);
    for (const auto& [key, i] : order) {
      if (Schedule* sender = schedule_of(links[i].from)) sender->stages[k].sends.push_back(std::move(links[i].stream));
    }
    for (Schedule& schedule : schedules) {
      Stage& stage = schedule.stages[k];
      for (const auto* streams : {&stage.sends, &stage.receives}) {
        for (const PeerStream& stream : *streams) {
          stage.rounds = std::max<int32_t>(stage.rounds, static_cast<int32_t>(stream.chunks.size()));
        }
      }
    }
  }
  for (size_t i = 0; i < plan.quantizes.size(); ++i) {
    const QuantizeOp& q = plan.quantizes[i];
    if (Schedule* schedule = schedule_of(q.target.rank)) {
      schedule->stages[q.stage].quantizes.push_back(static_cast<int32_t>(i));
    }
  }
  for (Schedule& schedule : schedules) schedule.scratch_handoff = !plan.quantizes.empty();
  return schedules;
}

}  // namespace

absl::StatusOr<Schedule> MakeRankSchedule(const Plan& plan, const BlockVector<Segment>& rank_segments, int32_t rank,
                                          int64_t staging_bytes, absl::Span<const int32_t> first_rounds) {
  if (first_rounds.size() != static_cast<size_t>(plan.stages)) {
    return absl::InvalidArgumentError(
        absl::StrCat("first rounds of ", first_rounds.size(), " stages for a plan of ", plan.stages));
  }
  SHARDSYNC_ASSIGN_OR_RETURN(std::vector<Schedule> schedules, SchedulesOf(plan, rank_segments, staging_bytes, rank));
  Schedule schedule = std::move(schedules[0]);
  for (size_t k = 0; k < schedule.stages.size(); ++k) schedule.stages[k].first_round = first_rounds[k];
  return schedule;
}

absl::StatusOr<std::vector<Schedule>> MakeSchedules(const Plan& plan, int64_t staging_bytes) {
  SHARDSYNC_ASSIGN_OR_RETURN(std::vector<Schedule> schedules,
                             SchedulesOf(plan, plan.segments, staging_bytes, std::nullopt));
  std::vector<std::vector<int32_t>> rounds(plan.stages, std::vector<int32_t>(plan.num_ranks, 0));  // [stage][rank]
  for (const Schedule& schedule : schedules) {
    for (int32_t k = 0; k < plan.stages; ++k) rounds[k][schedule.rank] = schedule.stages[k].rounds;
  }
  const std::vector<int32_t> first_rounds = FirstRounds(rounds);
  for (Schedule& schedule : schedules) {
    for (int32_t k = 0; k < plan.stages; ++k) schedule.stages[k].first_round = first_rounds[k];
  }
  return schedules;
}

}  // namespace shardsync::planner
