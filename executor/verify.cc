#include "executor/verify.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "executor/host_copy.h"

namespace shardsync::executor {
namespace {

// One region to read: a segment of `reads` and where its hash goes.
struct Region {
  bool target_side = false;
  int32_t tensor = 0;
  int32_t target_rank = 0;
  uint64_t place = 0;         // (sender, receiver, position) folded into one value
  bool expect_zeros = false;  // a fill: the source side is the hash of zeros
};

uint64_t Place(int32_t sender, int32_t receiver, int64_t position, size_t stage, bool fill) {
  return Mix64((static_cast<uint64_t>(sender) << 40) ^ (static_cast<uint64_t>(receiver) << 20) ^
               static_cast<uint64_t>(position) ^ (static_cast<uint64_t>(stage) << 60) ^ (fill ? 1ULL << 63 : 0));
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

// What a rank reads to verify: every segment it sends, receives or copies (both sides of
// a local copy) and every fill, as segments of one plan of reads, each with its region.
struct Reads {
  planner::Plan plan;
  std::vector<Region> regions;  // by segment of `plan`
};

Reads ReadsOf(const planner::Plan& plan, const planner::Schedule& schedule) {
  const int32_t rank = schedule.rank;
  Reads reads;
  const auto add = [&](const planner::Segment& segment, const planner::Segment& original, bool target_side,
                       uint64_t place, bool fill) {
    reads.plan.segments.push_back(segment);
    reads.regions.push_back({target_side, original.tensor, original.dst.rank, place, fill});
  };
  // A relayed segment's source side is the relay's target: the relay's own check
  // compares that with the sources, and a failed check invalidates every target.
  for (size_t k = 0; k < schedule.stages.size(); ++k) {
    const planner::Stage& stage = schedule.stages[k];
    for (const planner::PeerStream& stream : stage.sends) {
      for (size_t i = 0; i < stream.segments.size(); ++i) {
        const planner::Segment& s = plan.segments[stream.segments[i]];
        add(s, s, false, Place(rank, stream.peer, static_cast<int64_t>(i), k, false), false);
      }
    }
    for (const planner::PeerStream& stream : stage.receives) {
      for (size_t i = 0; i < stream.segments.size(); ++i) {
        const planner::Segment& s = plan.segments[stream.segments[i]];
        add(TargetView(s), s, true, Place(stream.peer, rank, static_cast<int64_t>(i), k, false), false);
      }
    }
    for (size_t i = 0; i < stage.local_segments.size(); ++i) {
      const planner::Segment& s = plan.segments[stage.local_segments[i]];
      const uint64_t place = Place(rank, rank, static_cast<int64_t>(i), k, false);
      add(s, s, false, place, false);
      add(TargetView(s), s, true, place, false);
    }
  }
  for (size_t i = 0; i < schedule.fills.size(); ++i) {
    const planner::Segment view = planner::FillRegion(plan.fills[schedule.fills[i]]);
    add(view, view, true, Place(rank, rank, static_cast<int64_t>(i), 0, true), true);
    reads.regions.back().target_rank = rank;
  }
  return reads;
}

// Where segment `s`'s elements lie back to back on its source side, in the dtype it
// hashes in, 8-byte aligned: its first byte there; else null.
const uint8_t* InPlace(const planner::Segment& s, const BufferTable& buffers) {
  if (s.src_dtype != s.dst_dtype || !IsContiguousRange(s, 0, planner::SegmentElements(s), /*source=*/true)) {
    return nullptr;
  }
  const uint8_t* first = buffers[s.src.buffer] + s.src_base * planner::ElementBytes(s.src_dtype);
  return reinterpret_cast<uintptr_t>(first) % 8 == 0 ? first : nullptr;
}

// The sum of the word hashes of every segment of `reads` (numbered from its start).
// A segment that lies in place is hashed where it lies; the others are packed on the
// device into batches of a staging buffer of at least `staging_bytes`, made only if
// one needs it.
absl::StatusOr<std::vector<uint64_t>> HashSegments(Device& device, const planner::Plan& reads,
                                                   const BufferTable& buffers, int64_t staging_bytes) {
  // A piece starts at a multiple of kPieceBytes of its segment (so its words are numbered
  // from there); a packed part at a 16-byte aligned offset of the staging buffer (so the
  // device reads whole words).
  constexpr int64_t kPieceBytes = 64 << 10;
  staging_bytes = std::max<int64_t>(staging_bytes, 1 << 20);
  uint8_t* staging = nullptr;
  struct Part {
    planner::ChunkPart elements;  // of reads.segments[elements.segment]
    int64_t offset;               // in the staging
    int64_t segment_byte;         // where it starts in its segment
    int64_t bytes;
  };
  std::vector<Part> batch;
  int64_t used = 0;
  std::vector<HashPiece> pieces;       // to queue next
  std::vector<int32_t> piece_segment;  // of every piece queued or to queue, in order
  const auto add_pieces = [&](const uint8_t* data, int64_t bytes, int64_t segment_byte, int32_t segment) {
    for (int64_t at = 0; at < bytes; at += kPieceBytes) {
      pieces.push_back({data + at, std::min(kPieceBytes, bytes - at), (segment_byte + at) / 8});
      piece_segment.push_back(segment);
    }
  };
  const auto flush = [&]() -> absl::Status {
    // One Pack for each run of parts that lie back to back.
    for (size_t first = 0; first < batch.size();) {
      size_t last = first + 1;
      while (last < batch.size() && batch[last].offset == batch[last - 1].offset + batch[last - 1].bytes) ++last;
      std::vector<planner::ChunkPart> run;
      for (size_t k = first; k < last; ++k) run.push_back(batch[k].elements);
      SHARDSYNC_RETURN_IF_ERROR(device.Pack(reads, run, buffers, staging + batch[first].offset, /*slot=*/0));
      first = last;
    }
    for (const Part& part : batch)
      add_pieces(staging + part.offset, part.bytes, part.segment_byte, part.elements.segment);
    // Queued behind this batch's packs and before the next batch's: no wait here.
    SHARDSYNC_RETURN_IF_ERROR(device.QueueHashes(pieces));
    pieces.clear();
    batch.clear();
    used = 0;
    return absl::OkStatus();
  };
  for (size_t r = 0; r < reads.segments.size(); ++r) {
    const planner::Segment& s = reads.segments[r];
    const int64_t element = planner::ElementBytes(s.dst_dtype);
    const int64_t elements = planner::SegmentElements(s);
    if (const uint8_t* data = InPlace(s, buffers)) {
      add_pieces(data, elements * element, 0, static_cast<int32_t>(r));
      continue;
    }
    if (staging == nullptr) {
      SHARDSYNC_ASSIGN_OR_RETURN(staging, device.Staging(/*peer=*/-1, /*send=*/true, /*slot=*/0, staging_bytes));
    }
    for (int64_t begin = 0; begin < elements;) {
      int64_t offset = (used + 15) / 16 * 16;
      if (offset + kPieceBytes > staging_bytes) {  // room for at least one piece, or flush
        SHARDSYNC_RETURN_IF_ERROR(flush());
        offset = 0;
      }
      // Whole pieces while they fit; the segment's last piece may be short.
      const int64_t room = (staging_bytes - offset) / kPieceBytes * kPieceBytes;
      const int64_t end = std::min(elements, begin + room / element);
      batch.push_back({{static_cast<int32_t>(r), begin, end}, offset, begin * element, (end - begin) * element});
      used = offset + (end - begin) * element;
      begin = end;
    }
  }
  SHARDSYNC_RETURN_IF_ERROR(flush());
  SHARDSYNC_ASSIGN_OR_RETURN(const std::vector<uint64_t> sums, device.CollectHashes());
  if (sums.size() != piece_segment.size()) {
    return absl::InternalError(absl::StrCat("the device hashed ", sums.size(), " pieces of ", piece_segment.size()));
  }
  std::vector<uint64_t> segment_sums(reads.segments.size(), 0);
  for (size_t k = 0; k < sums.size(); ++k) segment_sums[piece_segment[k]] += sums[k];
  // The staging buffer is extra device memory only while verifying: give it back.
  if (staging != nullptr) SHARDSYNC_RETURN_IF_ERROR(device.ReleaseStaging(/*peer=*/-1, /*send=*/true));
  return segment_sums;
}

}  // namespace

absl::StatusOr<Checksums> ComputeChecksums(Device& device, const planner::Plan& plan, const planner::Schedule& schedule,
                                           const BufferTable& buffers, int64_t staging_bytes) {
  const Reads reads = ReadsOf(plan, schedule);
  SHARDSYNC_ASSIGN_OR_RETURN(const std::vector<uint64_t> region_sums,
                             HashSegments(device, reads.plan, buffers, staging_bytes));
  Checksums sums_by_key;
  for (size_t r = 0; r < reads.regions.size(); ++r) {
    const Region& region = reads.regions[r];
    const planner::Segment& s = reads.plan.segments[r];
    const int64_t region_bytes = planner::SegmentElements(s) * planner::ElementBytes(s.dst_dtype);
    SideSums& side = sums_by_key[{plan.tensor_names[region.tensor], region.target_rank}];
    const auto hash = [&](uint64_t word_sum) { return Mix64(word_sum ^ Mix64(region_bytes)) ^ region.place; };
    (region.target_side ? side.targets : side.sources) += Mix64(hash(region_sums[r]));
    if (region.expect_zeros) {
      uint64_t zeros = 0;
      for (int64_t word = 0; word * 8 < region_bytes; ++word) zeros += WordHash(static_cast<uint64_t>(word), 0);
      side.sources += Mix64(hash(zeros));
    }
  }
  return sums_by_key;
}

}  // namespace shardsync::executor
