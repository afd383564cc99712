#include "planner/stats.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace shardsync::planner {

PlanStats ComputeStats(const Plan& plan, const std::vector<Schedule>& schedules) {
  PlanStats stats;
  stats.ranks.resize(plan.num_ranks);
  for (const Segment& s : plan.segments) {
    const int64_t bytes = SegmentBytes(s);
    ++stats.segments;
    if (s.src.rank == s.dst.rank) {
      stats.ranks[s.src.rank].local_bytes += bytes;
      ++stats.ranks[s.src.rank].segments;
      stats.total_local_bytes += bytes;
      continue;
    }
    stats.ranks[s.src.rank].sent_bytes += bytes;
    stats.ranks[s.dst.rank].received_bytes += bytes;
    ++stats.ranks[s.src.rank].segments;
    ++stats.ranks[s.dst.rank].segments;
    stats.link_bytes[{s.src.rank, s.dst.rank}] += bytes;
    stats.total_sent_bytes += bytes;
  }
  for (const FillOp& f : plan.fills) {
    stats.ranks[f.fill.holder.rank].fill_bytes += NumElements(f.fill.shape) * ElementBytes(f.dtype);
  }
  for (const Schedule& schedule : schedules) {
    RankStats& r = stats.ranks[schedule.rank];
    for (const auto* streams : {&schedule.sends, &schedule.receives}) {
      for (const PeerStream& stream : *streams) r.chunks += static_cast<int64_t>(stream.chunks.size());
    }
    r.rounds = schedule.rounds;
    for (const PeerStream& stream : schedule.sends) stats.chunks += static_cast<int64_t>(stream.chunks.size());
    stats.rounds = std::max(stats.rounds, schedule.rounds);
  }
  return stats;
}

double CostFloorSeconds(const PlanStats& stats, const Bandwidths& bw) {
  double floor = 0;
  for (const RankStats& r : stats.ranks) {
    const double link = std::max(r.sent_bytes, r.received_bytes) / bw.link_bytes_per_s;
    // A copy reads and writes each byte; a fill only writes.
    const double memory = (2.0 * r.local_bytes + r.fill_bytes) / bw.memory_bytes_per_s;
    floor = std::max({floor, link, memory});
  }
  return floor;
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
  for (const Segment& s : plan.segments) {
    for (int64_t v : {int64_t{s.tensor}, int64_t{s.src.rank}, int64_t{s.src.buffer}, int64_t{s.dst.rank},
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
