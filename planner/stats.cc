#include "planner/stats.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace shardsync::planner {

PlanStats ComputeStats(const Plan& plan, const std::vector<Schedule>& schedules) {
  PlanStats stats;
  stats.ranks.resize(plan.num_ranks);
  stats.stages.assign(plan.stages, std::vector<RankStats>(plan.num_ranks));
  const auto node = [&](int32_t rank) { return plan.node_of_rank.empty() ? 0 : plan.node_of_rank[rank]; };
  for (const Segment& s : plan.segments) {
    const int64_t bytes = SegmentBytes(s);
    const bool relayed = s.stage > 0;
    ++stats.segments;
    if (relayed) stats.total_relayed_bytes += bytes;
    for (RankStats* r : {&stats.ranks[s.src.rank], &stats.stages[s.stage][s.src.rank]}) {
      ++r->segments;
      if (relayed) r->relayed_bytes += bytes;
      if (s.src.rank == s.dst.rank) r->local_bytes += bytes;
      else r->sent_bytes += bytes;
    }
    if (s.src.rank == s.dst.rank) {
      stats.total_local_bytes += bytes;
      continue;
    }
    const bool network = node(s.src.rank) != node(s.dst.rank);
    for (RankStats* r : {&stats.ranks[s.dst.rank], &stats.stages[s.stage][s.dst.rank]}) {
      ++r->segments;
      r->received_bytes += bytes;
      if (network) r->network_received_bytes += bytes;
    }
    if (network) {
      stats.ranks[s.src.rank].network_sent_bytes += bytes;
      stats.stages[s.stage][s.src.rank].network_sent_bytes += bytes;
      stats.total_network_bytes += bytes;
    }
    stats.link_bytes[{s.src.rank, s.dst.rank}] += bytes;
    stats.total_sent_bytes += bytes;
  }
  for (const FillOp& f : plan.fills) {
    const int64_t bytes = NumElements(f.fill.shape) * ElementBytes(f.dtype);
    stats.ranks[f.fill.holder.rank].fill_bytes += bytes;
    stats.stages[0][f.fill.holder.rank].fill_bytes += bytes;
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

double CostFloorSeconds(const PlanStats& stats, const Bandwidths& bw) {
  double floor = 0;
  for (const std::vector<RankStats>& stage : stats.stages) {
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
    floor += slowest;
  }
  return floor;
}

absl::StatusOr<Plan> MakeCheaperPlan(const PlanInput& input, const ReplicaPolicy& policy, const Bandwidths& bandwidths,
                                     std::pair<double, double>* floors) {
  absl::StatusOr<Plan> direct = MakePlan(input, policy, PlanOptions{false});
  const std::vector<int32_t>& nodes = input.node_of_rank;
  const bool one_node = std::all_of(nodes.begin(), nodes.end(), [&](int32_t n) { return n == nodes[0]; });
  if (!direct.ok() || one_node) return direct;
  absl::StatusOr<Plan> relayed = MakePlan(input, policy, PlanOptions{true});
  if (!relayed.ok()) return relayed;
  const double direct_floor = CostFloorSeconds(ComputeStats(*direct, {}), bandwidths);
  const double relayed_floor = CostFloorSeconds(ComputeStats(*relayed, {}), bandwidths);
  if (floors != nullptr) *floors = {direct_floor, relayed_floor};
  return relayed_floor < direct_floor ? relayed : direct;
}

namespace {

// Two independent 64-bit lanes, each mixing one word at a time (splitmix64 finalizer).
class Digest {
 public:
  void Add(int64_t value) {
    a_ = Mix(a_ ^ static_cast<uint64_t>(value));
    b_ = Mix(b_ + static_cast<uint64_t>(value) * 0x9e3779b97f4a7c15ULL);
  }
  template <typename Values>
  void AddAll(const Values& values, size_t count) {
    Add(static_cast<int64_t>(count));
    for (size_t k = 0; k < count; ++k) Add(values[k]);
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

}  // namespace

std::string PlanDigest(const Plan& plan, int64_t staging_bytes) {
  Digest d;
  d.Add(staging_bytes);
  d.Add(plan.num_ranks);
  d.Add(plan.stages);
  for (const Segment& s : plan.segments) {
    for (int64_t v : {int64_t{s.tensor}, int64_t{s.stage}, int64_t{s.src.rank}, int64_t{s.src.buffer}, int64_t{s.dst.rank},
                      int64_t{s.dst.buffer}, s.src_base, s.dst_base, int64_t(s.src_dtype), int64_t(s.dst_dtype)}) {
      d.Add(v);
    }
    d.AddAll(s.shape, s.axes);
    d.AddAll(s.src_strides, s.axes);
    d.AddAll(s.dst_strides, s.axes);
  }
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
