#include "planner/stats.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardsync::planner {

namespace {

int32_t NodeOf(const Plan& plan, int32_t rank) { return plan.node_of_rank.empty() ? 0 : plan.node_of_rank[rank]; }

// Adds a segment's bytes to the ranks it touches.
void CountSegment(const Plan& plan, const Segment& s, std::vector<RankStats>& ranks) {
  const int64_t bytes = SegmentBytes(s);
  RankStats& from = ranks[s.src.rank];
  ++from.segments;
  if (s.stage > 0) from.relayed_bytes += bytes;
  if (s.src.rank == s.dst.rank) {
    from.local_bytes += bytes;
    return;
  }
  RankStats& to = ranks[s.dst.rank];
  ++to.segments;
  from.sent_bytes += bytes;
  to.received_bytes += bytes;
  if (NodeOf(plan, s.src.rank) != NodeOf(plan, s.dst.rank)) {
    from.network_sent_bytes += bytes;
    to.network_received_bytes += bytes;
  }
}

}  // namespace

std::vector<std::vector<RankStats>> StageBytes(const Plan& plan) {
  std::vector<std::vector<RankStats>> stages(plan.stages, std::vector<RankStats>(plan.num_ranks));
  for (const Segment& s : plan.segments) CountSegment(plan, s, stages[s.stage]);
  for (const FillOp& f : plan.fills) {
    stages[0][f.fill.holder.rank].fill_bytes += NumElements(f.fill.shape) * ElementBytes(f.dtype);
  }
  return stages;
}

PlanStats ComputeStats(const Plan& plan, const std::vector<Schedule>& schedules) {
  PlanStats stats;
  stats.stages = StageBytes(plan);
  stats.ranks.resize(plan.num_ranks);
  for (const std::vector<RankStats>& stage : stats.stages) {
    for (int32_t r = 0; r < plan.num_ranks; ++r) {
      RankStats& total = stats.ranks[r];
      const RankStats& part = stage[r];
      total.sent_bytes += part.sent_bytes;
      total.received_bytes += part.received_bytes;
      total.local_bytes += part.local_bytes;
      total.fill_bytes += part.fill_bytes;
      total.segments += part.segments;
      total.network_sent_bytes += part.network_sent_bytes;
      total.network_received_bytes += part.network_received_bytes;
      total.relayed_bytes += part.relayed_bytes;
    }
  }
  for (const Segment& s : plan.segments) {
    const int64_t bytes = SegmentBytes(s);
    ++stats.segments;
    if (s.stage > 0) stats.total_relayed_bytes += bytes;
    if (s.src.rank == s.dst.rank) {
      stats.total_local_bytes += bytes;
      continue;
    }
    if (NodeOf(plan, s.src.rank) != NodeOf(plan, s.dst.rank)) stats.total_network_bytes += bytes;
    stats.link_bytes[{s.src.rank, s.dst.rank}] += bytes;
    stats.total_sent_bytes += bytes;
  }
  for (const Schedule& schedule : schedules) {
    RankStats& r = stats.ranks[schedule.rank];
    for (const Stage& stage : schedule.stages) {
      for (const auto* streams : {&stage.sends, &stage.receives}) {
        for (const PeerStream& stream : *streams) r.chunks += static_cast<int64_t>(stream.chunks.size());
      }
      for (const PeerStream& stream : stage.sends) stats.chunks += static_cast<int64_t>(stream.chunks.size());
    }
    r.rounds = schedule.rounds();
    stats.rounds = std::max(stats.rounds, r.rounds);
  }
  return stats;
}

double CostFloorSeconds(const PlanStats& stats, const Bandwidths& bw) { return CostFloorSeconds(stats.stages, bw); }

double CostFloorSeconds(const std::vector<std::vector<RankStats>>& stages, const Bandwidths& bw) {
  double floor = 0;
  for (double stage : StageFloorSeconds(stages, bw)) floor += stage;
  return floor;
}

std::vector<double> StageFloorSeconds(const std::vector<std::vector<RankStats>>& stages, const Bandwidths& bw) {
  std::vector<double> floors;
  for (const std::vector<RankStats>& stage : stages) {
    double slowest = 0;
    for (const RankStats& r : stage) {
      const double link = std::max(r.sent_bytes - r.network_sent_bytes, r.received_bytes - r.network_received_bytes) /
                          bw.link_bytes_per_s;
      const int64_t network_bytes = std::max(r.network_sent_bytes, r.network_received_bytes);
      const double network = network_bytes > 0 ? network_bytes / bw.network_bytes_per_s : 0;
      // A copy reads and writes each byte; a fill only writes.
      const double memory = (2.0 * r.local_bytes + r.fill_bytes) / bw.memory_bytes_per_s;
      slowest = std::max({slowest, link, network, memory});
    }
    floors.push_back(slowest);
  }
  return floors;
}

absl::StatusOr<RelayMode> ParseRelayMode(absl::string_view name) {
  if (name == "never") return RelayMode::kNever;
  if (name == "always") return RelayMode::kAlways;
  if (name == "auto") return RelayMode::kAuto;
  return absl::InvalidArgumentError(absl::StrCat("the relay mode is auto, always or never, not '", name, "'"));
}

absl::StatusOr<Plan> MakePlanWithRelay(const PlanInput& input, const ReplicaPolicy& policy, RelayMode mode,
                                       const Bandwidths& bandwidths, std::pair<double, double>* floors) {
  if (mode != RelayMode::kAuto) return MakePlan(input, policy, PlanOptions{mode == RelayMode::kAlways});
  // With nothing to relay the relayed plan is the direct one: plan a second time only
  // when the relay changed something.
  absl::StatusOr<Plan> relayed = MakePlan(input, policy, PlanOptions{true});
  if (!relayed.ok() || relayed->stages == 1) return relayed;
  absl::StatusOr<Plan> direct = MakePlan(input, policy, PlanOptions{false});
  if (!direct.ok()) return direct;
  const double direct_floor = CostFloorSeconds(StageBytes(*direct), bandwidths);
  const double relayed_floor = CostFloorSeconds(StageBytes(*relayed), bandwidths);
  if (floors != nullptr) *floors = {direct_floor, relayed_floor};
  if (relayed_floor < direct_floor) return relayed;  // moved, as the line below
  return direct;
}

namespace {

// Two independent 64-bit lanes, each mixing one word at a time (splitmix64 finalizer).
class Digest {
 public:
  void Add(uint64_t value) {
    a_ = Mix(a_ ^ value);
    b_ = Mix(b_ + value * 0x9e3779b97f4a7c15ULL);
  }
  void Add(int64_t value) { Add(static_cast<uint64_t>(value)); }
  template <typename Values>
  void AddAll(const Values& values, size_t count) {
    Add(static_cast<uint64_t>(count));
    for (size_t k = 0; k < count; ++k) Add(static_cast<int64_t>(values[k]));
  }
  // Folds another digest in (the lanes of the odd segments).
  void Add(const Digest& other) {
    Add(other.a_);
    Add(other.b_);
  }
  std::string Hex() const { return absl::StrFormat("%016x%016x", a_, b_); }

 private:
  static uint64_t Mix(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  }
  uint64_t a_ = 0xcbf29ce484222325ULL;
  uint64_t b_ = 0x84222325cbf29ce4ULL;
};

uint64_t Pair(int32_t low, int32_t high) {
  return static_cast<uint32_t>(low) | (static_cast<uint64_t>(static_cast<uint32_t>(high)) << 32);
}

// Every field of a segment, two 32-bit values to a word.
void AddSegment(const Segment& s, Digest& d) {
  d.Add(Pair(s.tensor, s.stage | (int32_t(s.src_dtype) << 8) | (int32_t(s.dst_dtype) << 16) | (int32_t(s.axes) << 24)));
  d.Add(Pair(s.src.rank, s.src.buffer));
  d.Add(Pair(s.dst.rank, s.dst.buffer));
  d.Add(s.src_base);
  d.Add(s.dst_base);
  for (int k = 0; k < s.axes; ++k) d.Add(Pair(s.shape[k], s.src_strides[k]));
  for (int k = 0; k < s.axes; k += 2) d.Add(Pair(s.dst_strides[k], k + 1 < s.axes ? s.dst_strides[k + 1] : 0));
}

}  // namespace

std::string PlanDigest(const Plan& plan, int64_t staging_bytes) {
  Digest d;
  d.Add(staging_bytes);
  d.Add(int64_t{plan.num_ranks});
  d.Add(int64_t{plan.stages});
  d.Add(static_cast<uint64_t>(plan.segments.size()));
  // Even and odd segments in separate digests: two chains of multiplies run side by side.
  Digest even = d, odd;
  const size_t n = plan.segments.size();
  for (size_t i = 0; i + 1 < n; i += 2) {
    AddSegment(plan.segments[i], even);
    AddSegment(plan.segments[i + 1], odd);
  }
  if (n % 2 == 1) AddSegment(plan.segments[n - 1], even);
  d = even;
  d.Add(odd);
  for (const FillOp& f : plan.fills) {
    for (int64_t v : {int64_t{f.tensor}, int64_t{f.fill.holder.rank}, int64_t{f.fill.holder.buffer}, f.fill.base,
                      int64_t(f.dtype)}) {
      d.Add(v);
    }
    d.AddAll(f.fill.shape, f.fill.shape.size());
    d.AddAll(f.fill.strides, f.fill.strides.size());
  }
  return d.Hex();
}

}  // namespace shardsync::planner
