#include "executor/verify.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace shardsync::executor {
namespace {

uint64_t Finalize(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// One region to read: a segment of `reads` and where its hash goes.
struct Region {
  bool target_side = false;
  int32_t tensor = 0;
  int32_t target_rank = 0;
  uint64_t place = 0;  // (sender, receiver, position) folded into one value
  bool expect_zeros = false;  // a fill: the source side is the hash of zeros
};

uint64_t Place(int32_t sender, int32_t receiver, int64_t position, bool fill) {
  return Finalize((static_cast<uint64_t>(sender) << 40) ^ (static_cast<uint64_t>(receiver) << 20) ^
                  static_cast<uint64_t>(position) ^ (fill ? 1ULL << 63 : 0));
}

// The same elements read from the target side: source := target.
planner::Segment TargetView(const planner::Segment& s) {
  planner::Segment view = s;
  view.src = s.dst;
  view.src_base = s.dst_base;
  view.src_strides = s.dst_strides;
  view.src_dtype = s.dst_dtype;
  return view;
}

planner::Segment FillView(const planner::FillOp& f) {
  planner::Segment view;
  view.tensor = f.tensor;
  view.src = view.dst = f.fill.holder;
  view.src_base = view.dst_base = f.fill.base;
  view.src_dtype = view.dst_dtype = f.dtype;
  view.axes = static_cast<int8_t>(std::max<size_t>(1, f.fill.shape.size()));
  view.shape.fill(1);
  view.src_strides.fill(1);
  for (size_t k = 0; k < f.fill.shape.size(); ++k) {
    view.shape[k] = f.fill.shape[k];
    view.src_strides[k] = f.fill.strides[k];
  }
  view.dst_strides = view.src_strides;
  return view;
}

}  // namespace

void StreamHash::Mix(uint64_t word) {
  state_ ^= word * 0x87c37b91114253d5ULL;
  state_ = (state_ << 31 | state_ >> 33) * 0x4cf5ad432745937fULL;
}

void StreamHash::Update(const uint8_t* data, int64_t bytes) {
  length_ += bytes;
  while (bytes > 0 && pending_bytes_ > 0) {  // finish a word begun by the last call
    pending_ |= static_cast<uint64_t>(*data++) << (8 * pending_bytes_);
    --bytes;
    if (++pending_bytes_ == 8) {
      Mix(pending_);
      pending_ = 0;
      pending_bytes_ = 0;
    }
  }
  for (; bytes >= 8; data += 8, bytes -= 8) {
    uint64_t word;
    std::memcpy(&word, data, 8);
    Mix(word);
  }
  for (; bytes > 0; --bytes) pending_ |= static_cast<uint64_t>(*data++) << (8 * pending_bytes_++);
}

uint64_t StreamHash::Final() const {
  uint64_t state = state_;
  if (pending_bytes_ > 0) state = (state ^ pending_ * 0x87c37b91114253d5ULL) * 0x4cf5ad432745937fULL;
  return Finalize(state ^ static_cast<uint64_t>(length_));
}

absl::StatusOr<Checksums> ComputeChecksums(Device& device, const planner::Plan& plan,
                                           const planner::Schedule& schedule, const BufferTable& buffers,
                                           int64_t scratch_bytes) {
  const int32_t rank = schedule.rank;
  scratch_bytes = std::max<int64_t>(scratch_bytes, 1024);  // room for any element
  planner::Plan reads;
  std::vector<Region> regions;
  const auto add = [&](const planner::Segment& segment, const planner::Segment& original, bool target_side,
                       uint64_t place, bool fill) {
    reads.segments.push_back(segment);
    regions.push_back({target_side, original.tensor, original.dst.rank, place, fill});
  };
  for (const planner::PeerStream& stream : schedule.sends) {
    for (size_t i = 0; i < stream.segments.size(); ++i) {
      const planner::Segment& s = plan.segments[stream.segments[i]];
      add(s, s, false, Place(rank, stream.peer, static_cast<int64_t>(i), false), false);
    }
  }
  for (const planner::PeerStream& stream : schedule.receives) {
    for (size_t i = 0; i < stream.segments.size(); ++i) {
      const planner::Segment& s = plan.segments[stream.segments[i]];
      add(TargetView(s), s, true, Place(stream.peer, rank, static_cast<int64_t>(i), false), false);
    }
  }
  for (size_t i = 0; i < schedule.local_segments.size(); ++i) {
    const planner::Segment& s = plan.segments[schedule.local_segments[i]];
    const uint64_t place = Place(rank, rank, static_cast<int64_t>(i), false);
    add(s, s, false, place, false);
    add(TargetView(s), s, true, place, false);
  }
  for (size_t i = 0; i < schedule.fills.size(); ++i) {
    const planner::Segment view = FillView(plan.fills[schedule.fills[i]]);
    add(view, view, true, Place(rank, rank, static_cast<int64_t>(i), true), true);
    regions.back().target_rank = rank;
  }

  Checksums sums;
  absl::StatusOr<uint8_t*> scratch = device.Staging(/*peer=*/-1, /*send=*/true, scratch_bytes);
  if (!scratch.ok()) return scratch.status();
  std::vector<uint8_t> host(static_cast<size_t>(scratch_bytes));
  std::vector<StreamHash> hashes(regions.size());
  std::vector<planner::ChunkPart> batch;
  int64_t batch_bytes = 0;
  const auto flush = [&]() -> absl::Status {
    if (batch.empty()) return absl::OkStatus();
    if (auto status = device.Pack(reads, batch, buffers, *scratch); !status.ok()) return status;
    if (auto status = device.ReadBack(*scratch, batch_bytes, host.data()); !status.ok()) return status;
    const uint8_t* at = host.data();
    for (const planner::ChunkPart& part : batch) {
      const int64_t bytes = (part.end - part.begin) * planner::ElementBytes(reads.segments[part.segment].dst_dtype);
      hashes[part.segment].Update(at, bytes);
      at += bytes;
    }
    batch.clear();
    batch_bytes = 0;
    return absl::OkStatus();
  };
  for (size_t r = 0; r < regions.size(); ++r) {
    const planner::Segment& s = reads.segments[r];
    const int64_t element = planner::ElementBytes(s.dst_dtype);
    const int64_t elements = planner::SegmentElements(s);
    for (int64_t begin = 0; begin < elements;) {
      if ((scratch_bytes - batch_bytes) / element == 0) {
        if (auto status = flush(); !status.ok()) return status;
      }
      const int64_t end = std::min(elements, begin + (scratch_bytes - batch_bytes) / element);
      batch.push_back({static_cast<int32_t>(r), begin, end});
      batch_bytes += (end - begin) * element;
      begin = end;
    }
  }
  if (auto status = flush(); !status.ok()) return status;

  std::vector<uint8_t> zeros(static_cast<size_t>(std::min<int64_t>(scratch_bytes, 1 << 20)), 0);
  for (size_t r = 0; r < regions.size(); ++r) {
    const Region& region = regions[r];
    SideSums& side = sums[{plan.tensor_names[region.tensor], region.target_rank}];
    const auto mixed = [&](uint64_t hash) { return Finalize(hash ^ region.place); };
    (region.target_side ? side.targets : side.sources) += mixed(hashes[r].Final());
    if (region.expect_zeros) {
      StreamHash expected;
      int64_t left = planner::SegmentElements(reads.segments[r]) * planner::ElementBytes(reads.segments[r].dst_dtype);
      for (; left > 0; left -= static_cast<int64_t>(zeros.size())) {
        expected.Update(zeros.data(), std::min<int64_t>(left, static_cast<int64_t>(zeros.size())));
      }
      side.sources += mixed(expected.Final());
    }
  }
  return sums;
}

}  // namespace shardsync::executor
