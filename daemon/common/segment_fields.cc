#include "daemon/common/segment_fields.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardsync::daemon {
namespace {

// A difference as an unsigned number that is small when the difference is near zero
// either way: 0, -1, 1, -2 ... -> 0, 1, 2, 3 ...
uint64_t ZigZag(uint64_t difference) { return (difference << 1) ^ (0 - (difference >> 63)); }
uint64_t UnZigZag(uint64_t zigzag) { return (zigzag >> 1) ^ (0 - (zigzag & 1)); }

}  // namespace

void SegmentFieldsWriter::Append(const SegmentFields& fields, std::string& out) {
  uint8_t encoded[kMaxBytes];
  uint8_t* end = encoded;
  const int64_t axes = std::clamp<int64_t>(fields[kSegmentAxesField], 0, planner::kMaxAxes);
  for (int k = 0; k < SegmentFieldCount(axes); ++k) {
    const uint64_t difference = static_cast<uint64_t>(fields[k]) - static_cast<uint64_t>(previous_[k]);
    end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(ZigZag(difference), end);
  }
  out.append(reinterpret_cast<const char*>(encoded), end - encoded);
  previous_ = fields;
}

SegmentFieldsReader::SegmentFieldsReader(absl::string_view bytes)
    : in_(reinterpret_cast<const uint8_t*>(bytes.data()), static_cast<int>(bytes.size())),
      size_(static_cast<int>(bytes.size())) {}

absl::Status SegmentFieldsReader::Next(SegmentFields& fields) {
  fields = previous_;
  const auto read = [&](int from, int to) {
    for (int k = from; k < to; ++k) {
      uint64_t zigzag = 0;
      if (!in_.ReadVarint64(&zigzag)) return false;
      fields[k] = static_cast<int64_t>(static_cast<uint64_t>(fields[k]) + UnZigZag(zigzag));
    }
    return true;
  };
  if (!read(0, kSegmentScalarFields)) return absl::InvalidArgumentError("the bytes end inside a segment");
  const int64_t axes = fields[kSegmentAxesField];
  if (axes < 1 || axes > planner::kMaxAxes)
    return absl::InvalidArgumentError(absl::StrCat("a segment of ", axes, " axes"));
  if (!read(kSegmentScalarFields, SegmentFieldCount(axes))) {
    return absl::InvalidArgumentError("the bytes end inside a segment");
  }
  std::fill(fields.begin() + SegmentFieldCount(axes), fields.end(), 0);  // the axes it lacks
  previous_ = fields;
  return absl::OkStatus();
}

}  // namespace shardsync::daemon
