// One rank's part of a plan: local copies, fills, and per peer an ordered stream of
// send segments and one of receive segments, cut into chunks that fit one staging slot. Both ends of a link derive the
// same stream order and the same cuts from the plan, so chunk k that rank a sends to b is exactly chunk k that b
// receives from a.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "planner/plan.h"

namespace shardsync::planner {

// Elements [begin, end) of a segment, counted in its row-major order.
struct ChunkPart {
  int32_t segment = 0;  // index into Plan::segments
  int64_t begin = 0;
  int64_t end = 0;
};

// A stretch of a stream: from element `first_begin` of its segment at position `first`
// to element `last_end` (exclusive) of its segment at position `last` (inclusive).
// Positions index PeerStream::segments.
struct Chunk {
  int32_t first = 0;
  int32_t last = 0;
  int64_t first_begin = 0;
  int64_t last_end = 0;
  int64_t bytes = 0;  // in the target dtype: what crosses the link
};

struct PeerStream {
  int32_t peer = 0;
  std::vector<int32_t> segments;  // indices into Plan::segments, in stream order
  std::vector<Chunk> chunks;
  int64_t bytes = 0;
};

// The segment pieces a chunk covers, in stream order.
std::vector<ChunkPart> ChunkParts(const Plan& plan, const PeerStream& stream, const Chunk& chunk);

// Staging is double buffered (executor/device.h): while round k is on the link, round
// k+1 is packed into the other slot and round k-1 unpacked from it. The staging budget
// is per peer and covers both directions, two slots each, so a chunk holds at most a
// quarter of it.
inline constexpr int kStagingSlots = 2;
inline constexpr int kStagingBuffersPerPeer = 2 * kStagingSlots;  // send and receive
inline int64_t MaxChunkBytes(int64_t staging_bytes) { return staging_bytes / kStagingBuffersPerPeer; }
// The smallest staging budget the daemons accept (per peer): 1 KiB chunks. Smaller
// budgets spend more on rounds than on bytes.
inline constexpr int64_t kMinStagingBytes = 4096;
// The most chunks one plan is cut into: a budget too small for the model is refused
// instead of planning for minutes.
inline constexpr int64_t kMaxChunksPerPlan = int64_t{1} << 24;

// One stage of a rank's part (Segment::stage). A rank runs its stages in order: the
// relay stage reads targets the stage before it wrote, so it starts once that one is
// done on this rank. Round k of a stage moves chunk k of each of its streams.
struct Stage {
  std::vector<int32_t> local_segments;  // source and target on this rank
  std::vector<PeerStream> sends;        // by ascending peer
  std::vector<PeerStream> receives;     // by ascending peer
  int32_t rounds = 0;                   // a stream with fewer chunks is idle after
  // The transport's number of this stage's round 0: the same on every rank (the rounds
  // of earlier stages, on the rank that has the most), so both ends of a chunk name it
  // alike.
  int32_t first_round = 0;
  // Block-quantized targets of this rank whose bytes this stage brings: indices into
  // Plan::quantizes, quantized at the end of the stage.
  std::vector<int32_t> quantizes;
};

struct Schedule {
  int32_t rank = 0;
  std::vector<int32_t> fills;  // indices into Plan::fills on this rank, with stage 0
  std::vector<Stage> stages;   // Plan::stages of them, some maybe empty
  int32_t rounds() const;      // of every stage
  // Set on every rank when the plan quantizes: scratch is reused from stage to stage,
  // so a rank writing a peer's memory directly in a stage after the first waits until
  // that peer says its earlier quantizes are done (RoundEngine).
  bool scratch_handoff = false;
};

// Schedules of every rank in one pass over the plan. `staging_bytes` is the budget per
// peer (both directions); each of its slots must hold one element of every dtype moved,
// and the plan must fit kMaxChunksPerPlan chunks (else RESOURCE_EXHAUSTED).
absl::StatusOr<std::vector<Schedule>> MakeSchedules(const Plan& plan, int64_t staging_bytes);

// The first round of each stage, from the rounds of each stage on each rank ([stage]
// [rank]): the rounds of the earlier stages on their busiest rank. Stages run one after
// another on every rank, so every rank's stage k starts at the same round.
std::vector<int32_t> FirstRounds(const std::vector<std::vector<int32_t>>& rounds);

// Chunks and rounds as MakeSchedules cuts them, counted from a plan's segments as they
// come in plan order (StreamPlan's sink), none kept: a streamed plan's rounds, the
// first round of each stage that every rank's schedule carries, and each link's bytes.
struct RoundCounts {
  std::vector<int32_t> first_rounds;                          // by stage: Stage::first_round on every rank
  std::vector<std::vector<int32_t>> rounds;                   // [stage][rank]: Stage::rounds
  std::vector<int64_t> chunks;                                // by rank: sent and received
  int64_t link_chunks = 0;                                    // every chunk once
  std::map<std::pair<int32_t, int32_t>, int64_t> link_bytes;  // (from, to) -> bytes, every stage
};

class RoundCounter {
 public:
  // `tensor_names` by tensor index, for errors; MakeSchedules' checks and errors.
  RoundCounter(int32_t num_ranks, int64_t staging_bytes, std::vector<std::string> tensor_names);
  ~RoundCounter();
  absl::Status Add(absl::Span<const Segment> segments);
  RoundCounts Finish(int32_t stages);

 private:
  struct Links;  // a cutter per link and stage
  int32_t num_ranks_;
  std::vector<std::string> tensor_names_;
  std::unique_ptr<Links> links_;
};

// One rank's schedule from that rank's segments alone (its sends, receives and local
// copies, in plan order), read in place of `plan`'s own (which may hold none), and the
// plan's fills and quantizes: MakeSchedules' schedule of `rank`, with each stage's first
// round taken from the whole plan's (RoundCounts::first_rounds). Indices into segments
// are into `rank_segments`.
absl::StatusOr<Schedule> MakeRankSchedule(const Plan& plan, const BlockVector<Segment>& rank_segments, int32_t rank,
                                          int64_t staging_bytes, absl::Span<const int32_t> first_rounds);

// What an executor checks of a schedule it was sent: every chunk's bytes are its parts'
// (none empty) and fit one slot of `staging_bytes`; no stream has more chunks than its
// stage has rounds; every segment and quantize of a stage is of that stage (and the
// quantizes of this rank).
absl::Status CheckChunks(const Plan& plan, const Schedule& schedule, int64_t staging_bytes);

}  // namespace shardsync::planner
