// Each rank's segments of a streamed plan, in plan order, kept in a file until the
// rank's schedule is made: while a plan streams, memory holds one block per rank, and a
// rank's segments are read back alone. A block is kept compact, as the segments of a
// PrepareRequest are (daemon/common/segment_fields.h, from the block's start: a rank's
// segments mostly continue each other, 15-19 bytes, not 88). The file has no
// name (made and unlinked at once) and is closed with the object, so nothing is left
// behind on any exit. Add and Finish from one thread; Read after Finish, from any.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/common/segment_fields.h"
#include "planner/block_vector.h"
#include "planner/plan.h"

namespace shardsync::coordinator {

class SegmentSpill {
 public:
  // A block's bytes, at least (one segment more at most): what one rank keeps in memory
  // while the plan streams, and what a read of its segments gets at once.
  static constexpr size_t kBlockBytes = 64 << 10;

  // A file in `directory` for a plan of `num_ranks` ranks; the error names the directory.
  static absl::StatusOr<std::unique_ptr<SegmentSpill>> Create(const std::string& directory, int32_t num_ranks);
  ~SegmentSpill();
  SegmentSpill(const SegmentSpill&) = delete;
  SegmentSpill& operator=(const SegmentSpill&) = delete;

  // Each segment to its sender's and its receiver's segments (once for a local copy).
  absl::Status Add(absl::Span<const planner::Segment> segments);
  // Writes what the blocks still hold; no Add after it.
  absl::Status Finish();
  // `rank`'s segments, in plan order; the axes past a segment's `axes` read as zero.
  absl::StatusOr<planner::BlockVector<planner::Segment>> Read(int32_t rank) const;
  int64_t file_bytes() const { return end_; }

 private:
  struct Block {
    int64_t offset = 0;
    int64_t bytes = 0;
    int64_t count = 0;  // segments
  };
  SegmentSpill(int fd, std::string directory, int32_t num_ranks);
  absl::Status Append(int32_t rank, const planner::Segment& segment);
  absl::Status Flush(int32_t rank);

  int fd_;
  std::string directory_;
  int64_t end_ = 0;
  struct OpenBlock {
    std::string bytes;  // encoded
    int64_t count = 0;  // segments
    daemon::SegmentFieldsWriter writer;
  };
  std::vector<OpenBlock> open_;             // by rank: the block being filled
  std::vector<std::vector<Block>> blocks_;  // by rank: the blocks written, in order
};

}  // namespace shardsync::coordinator
