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

// Two FNV-1a-style 64-bit lanes with different seeds and primes.
class Digest {
 public:
  void Add(int64_t value) {
    for (int i = 0; i < 8; ++i) {
      const uint64_t byte = (static_cast<uint64_t>(value) >> (8 * i)) & 0xff;
      a_ = (a_ ^ byte) * 0x100000001b3ULL;
      b_ = (b_ ^ byte) * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL;
    }
  }
  void Add(const Index& index) {
    Add(static_cast<int64_t>(index.size()));
    for (int64_t v : index) Add(v);
  }
  std::string Hex() const { return absl::StrFormat("%016x%016x", a_, b_); }

 private:
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
    d.Add(s.shape);
    d.Add(s.src_strides);
    d.Add(s.dst_strides);
  }
  for (const FillOp& f : plan.fills) {
    for (int64_t v : {int64_t{f.tensor}, int64_t{f.fill.holder.rank}, int64_t{f.fill.holder.buffer}, f.fill.base,
                      int64_t(f.dtype)}) {
      d.Add(v);
    }
    d.Add(f.fill.shape);
    d.Add(f.fill.strides);
  }
  return d.Hex();
}

}  // namespace shardsync::planner
