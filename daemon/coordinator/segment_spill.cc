#include "daemon/coordinator/segment_spill.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"

namespace shardsync::coordinator {
namespace {

constexpr int kMaxVarintBytes = 10;
constexpr int kMaxFields = SegmentSpill::kMaxFields;
constexpr int kAxesField = 2;  // ForEachField's third

// Calls `field(value)` on each field of `s` that a block keeps, in the order written:
// SegmentSpill::kScalarFields, then three an axis.
template <typename Segment, typename Field>
void ForEachField(Segment& s, Field field) {
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
  for (int k = 0; k < s.axes; ++k) {
    field(s.shape[k]);
    field(s.src_strides[k]);
    field(s.dst_strides[k]);
  }
}

using Fields = std::array<int64_t, kMaxFields>;

// `s`'s fields in the order written, zero past its axes.
Fields FieldsOf(const planner::Segment& s) {
  Fields fields{};
  int n = 0;
  ForEachField(s, [&](const auto& value) { fields[n++] = static_cast<int64_t>(value); });
  return fields;
}

// The segment of `fields` (FieldsOf's inverse; its axes were checked).
planner::Segment SegmentOf(const Fields& fields) {
  planner::Segment s{};
  int n = 0;
  // `axes` is set third, before ForEachField reads it to walk the axes.
  ForEachField(s, [&](auto& field) { field = static_cast<std::remove_reference_t<decltype(field)>>(fields[n++]); });
  return s;
}

// A difference as an unsigned number that is small when the difference is near zero
// either way (protobuf's sint64 encoding): 0, -1, 1, -2 ... -> 0, 1, 2, 3 ...
uint64_t ZigZag(uint64_t difference) { return (difference << 1) ^ (0 - (difference >> 63)); }
uint64_t UnZigZag(uint64_t zigzag) { return (zigzag >> 1) ^ (0 - (zigzag & 1)); }

int FieldCount(int64_t axes) { return SegmentSpill::kScalarFields + 3 * static_cast<int>(axes); }

}  // namespace

absl::StatusOr<std::unique_ptr<SegmentSpill>> SegmentSpill::Create(const std::string& directory, int32_t num_ranks) {
  std::string path = absl::StrCat(directory, "/shardsync-plan-XXXXXX");
  const int fd = mkostemp(path.data(), O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    return absl::Status(error == ENOSPC ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kFailedPrecondition,
                        absl::StrCat("cannot make the plan's file in '", directory, "': ", std::strerror(error)));
  }
  unlink(path.c_str());  // the open descriptor keeps it until closed
  return std::unique_ptr<SegmentSpill>(new SegmentSpill(fd, directory, num_ranks));
}

SegmentSpill::SegmentSpill(int fd, std::string directory, int32_t num_ranks)
    : fd_(fd), directory_(std::move(directory)), open_(num_ranks), blocks_(num_ranks) {}

SegmentSpill::~SegmentSpill() { close(fd_); }

absl::Status SegmentSpill::Add(absl::Span<const planner::Segment> segments) {
  for (const planner::Segment& s : segments) {
    SHARDSYNC_RETURN_IF_ERROR(Append(s.src.rank, s));
    if (s.dst.rank != s.src.rank) SHARDSYNC_RETURN_IF_ERROR(Append(s.dst.rank, s));
  }
  return absl::OkStatus();
}

absl::Status SegmentSpill::Append(int32_t rank, const planner::Segment& segment) {
  if (rank < 0 || rank >= static_cast<int32_t>(open_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("a segment of rank ", rank, " in a plan of ", open_.size()));
  }
  if (segment.axes < 1 || segment.axes > planner::kMaxAxes) {
    return absl::InvalidArgumentError(absl::StrCat("a segment of ", segment.axes, " axes"));
  }
  OpenBlock& block = open_[rank];
  // Once a rank has segments, its block holds one more than kBlockBytes at most.
  if (block.bytes.capacity() == 0) block.bytes.reserve(kBlockBytes + kMaxFields * kMaxVarintBytes);
  const Fields fields = FieldsOf(segment);
  uint8_t encoded[kMaxFields * kMaxVarintBytes];
  uint8_t* end = encoded;
  for (int k = 0; k < FieldCount(segment.axes); ++k) {
    const uint64_t difference = static_cast<uint64_t>(fields[k]) - static_cast<uint64_t>(block.previous[k]);
    end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(ZigZag(difference), end);
  }
  block.bytes.insert(block.bytes.end(), encoded, end);
  block.previous = fields;
  ++block.count;
  return block.bytes.size() >= kBlockBytes ? Flush(rank) : absl::OkStatus();
}

absl::Status SegmentSpill::Flush(int32_t rank) {
  OpenBlock& block = open_[rank];
  if (block.count == 0) return absl::OkStatus();
  const char* data = reinterpret_cast<const char*>(block.bytes.data());
  const int64_t bytes = static_cast<int64_t>(block.bytes.size());
  for (int64_t done = 0; done < bytes;) {
    const ssize_t n = pwrite(fd_, data + done, bytes - done, end_ + done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;
      return absl::Status(
          error == ENOSPC ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal,
          absl::StrCat("writing the plan's file in '", directory_, "' at ", end_ + done, ": ", std::strerror(error)));
    }
    done += n;
  }
  blocks_[rank].push_back(Block{end_, bytes, block.count});
  end_ += bytes;
  block.bytes.clear();
  block.count = 0;
  block.previous = {};
  return absl::OkStatus();
}

absl::Status SegmentSpill::Finish() {
  for (int32_t rank = 0; rank < static_cast<int32_t>(open_.size()); ++rank) {
    SHARDSYNC_RETURN_IF_ERROR(Flush(rank));
    std::vector<uint8_t>().swap(open_[rank].bytes);
  }
  return absl::OkStatus();
}

absl::StatusOr<planner::BlockVector<planner::Segment>> SegmentSpill::Read(int32_t rank) const {
  if (rank < 0 || rank >= static_cast<int32_t>(blocks_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is outside a plan of ", blocks_.size()));
  }
  const auto failed = [&](absl::string_view why) {
    return absl::InternalError(
        absl::StrCat("reading rank ", rank, "'s segments from the plan's file in '", directory_, "': ", why));
  };
  planner::BlockVector<planner::Segment> segments;
  std::vector<uint8_t> encoded;
  for (const Block& b : blocks_[rank]) {
    encoded.resize(b.bytes);
    char* data = reinterpret_cast<char*>(encoded.data());
    for (int64_t done = 0; done < b.bytes;) {
      const ssize_t n = pread(fd_, data + done, b.bytes - done, b.offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return failed(n < 0 ? std::strerror(errno) : "short file");
      done += n;
    }
    google::protobuf::io::CodedInputStream in(encoded.data(), static_cast<int>(b.bytes));
    Fields fields{};  // the previous segment's, then this one's
    const auto read = [&](int from, int to) {
      for (int k = from; k < to; ++k) {
        uint64_t zigzag = 0;
        if (!in.ReadVarint64(&zigzag)) return false;
        fields[k] = static_cast<int64_t>(static_cast<uint64_t>(fields[k]) + UnZigZag(zigzag));
      }
      return true;
    };
    for (int64_t i = 0; i < b.count; ++i) {
      if (!read(0, SegmentSpill::kScalarFields)) return failed("a block ends inside a segment");
      const int64_t axes = fields[kAxesField];
      if (axes < 1 || axes > planner::kMaxAxes) return failed(absl::StrCat("a segment of ", axes, " axes"));
      if (!read(SegmentSpill::kScalarFields, FieldCount(axes))) return failed("a block ends inside a segment");
      std::fill(fields.begin() + FieldCount(axes), fields.end(), 0);  // the axes it lacks, as FieldsOf
      segments.push_back(SegmentOf(fields));
    }
    if (in.CurrentPosition() != b.bytes) return failed("a block is longer than its segments");
  }
  return segments;
}

}  // namespace shardsync::coordinator
