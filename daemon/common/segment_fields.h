// A segment's fields kept compactly, the one format of the plan's file (the coordinator's
// SegmentSpill) and of PrepareRequest.segment_table: a segment as kSegmentScalarFields
// integers, the third its axes (1..planner::kMaxAxes), then three an axis used; each
// written as the zigzag varint (protobuf's sint64 encoding) of its difference from the
// same field of the segment before, the first segment's from zero. Segments that
// continue each other, as one rank's do in plan order, take 15-19 bytes instead of 88.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/io/coded_stream.h"
#include "planner/plan.h"

namespace shardsync::daemon {

inline constexpr int kSegmentScalarFields = 11;
inline constexpr int kSegmentAxesField = 2;
inline constexpr int kMaxSegmentFields = kSegmentScalarFields + 3 * planner::kMaxAxes;
// A segment's fields, zero past its axes.
using SegmentFields = std::array<int64_t, kMaxSegmentFields>;

// The fields a segment of `axes` axes writes.
inline int SegmentFieldCount(int64_t axes) { return kSegmentScalarFields + 3 * static_cast<int>(axes); }

class SegmentFieldsWriter {
 public:
  // Longest a segment's encoding can be.
  static constexpr size_t kMaxBytes = kMaxSegmentFields * 10;
  // Appends `fields` (zero past its axes) to `out`. Axes outside 1..planner::kMaxAxes
  // are written as they are, with the axis fields that fit: a reader refuses them.
  void Append(const SegmentFields& fields, std::string& out);

 private:
  SegmentFields previous_{};
};

class SegmentFieldsReader {
 public:
  // `bytes` outlives the reader.
  explicit SegmentFieldsReader(absl::string_view bytes);
  bool done() const { return in_.CurrentPosition() == size_; }
  // The next segment's fields, zero past its axes; INVALID_ARGUMENT where the bytes end
  // inside a segment or a segment's axes are outside 1..planner::kMaxAxes, saying which.
  absl::Status Next(SegmentFields& fields);

 private:
  google::protobuf::io::CodedInputStream in_;
  int size_;
  SegmentFields previous_{};
};

}  // namespace shardsync::daemon
