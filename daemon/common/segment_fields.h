// A segment's fields kept compactly, the one format of the plan's file (the coordinator's
// SegmentSpill) and of PrepareRequest.segment_table: a segment as kSegmentScalarFields
// integers, the third its axes (1..planner::kMaxAxes), then three an axis used; each
// written as the zigzag varint (protobuf's sint64 encoding) of its difference from the
// same field of the segment before, the first segment's from zero. Segments that
// continue each other, as one rank's do in plan order, take 15-26 bytes instead of 88.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

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

// Calls `field(member)` on each field of `s` in the order kept. `S` is planner::Segment
// or a struct with members of the same names (PrepareRequest's SegmentRecord). Axes past
// planner::kMaxAxes have no fields: a reader refuses such a segment by its axes.
template <typename S, typename Field>
void ForEachSegmentField(S& s, Field field) {
  field(s.tensor);
  field(s.stage);
  field(s.axes);
  field(s.src_dtype);
  field(s.dst_dtype);
  field(s.src.rank);
  field(s.src.buffer);
  field(s.dst.rank);
  field(s.dst.buffer);
  field(s.src_base);
  field(s.dst_base);
  for (int k = 0; k < std::min<int>(s.axes, planner::kMaxAxes); ++k) {
    field(s.shape[k]);
    field(s.src_strides[k]);
    field(s.dst_strides[k]);
  }
}

// `s`'s fields, zero past its axes.
template <typename S>
SegmentFields FieldsOf(const S& s) {
  SegmentFields fields{};
  int n = 0;
  ForEachSegmentField(s, [&](const auto& member) { fields[n++] = static_cast<int64_t>(member); });
  return fields;
}

// `s` from `fields` as a SegmentFieldsReader gave them (axes in range); false where a
// field does not fit its member's type.
template <typename S>
bool FromFields(const SegmentFields& fields, S& s) {
  s = S{};
  int n = 0;
  bool fits = true;
  // `axes` is set third, before ForEachSegmentField reads it to walk the axes.
  ForEachSegmentField(s, [&](auto& member) {
    using Member = std::remove_reference_t<decltype(member)>;
    using Number = typename std::conditional_t<std::is_enum_v<Member>, std::underlying_type<Member>,
                                               std::enable_if<true, Member>>::type;
    const int64_t value = fields[n++];
    fits = fits && value >= std::numeric_limits<Number>::min() && value <= std::numeric_limits<Number>::max();
    member = static_cast<Member>(value);
  });
  return fits;
}

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
