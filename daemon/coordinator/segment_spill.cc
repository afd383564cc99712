#include "daemon/coordinator/segment_spill.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace shardsync::coordinator {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr int kMaxVarintBytes = 10;
// Fields of a segment with every axis: 11 scalars and three per axis.
constexpr int kMaxFields = 11 + 3 * planner::kMaxAxes;

// Calls `field(value)` on each field of `s` that a block keeps, in the order written.
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

template <typename T>
int64_t AsInt(T value) {
  return static_cast<int64_t>(value);
}

// Appends `segments`, each against the one before it (the first against a zero
// segment), at `out`; returns the end.
uint8_t* Encode(const std::vector<planner::Segment>& segments, uint8_t* out) {
  const planner::Segment zero{};
  const planner::Segment* previous = &zero;
  for (const planner::Segment& s : segments) {
    int64_t before[kMaxFields];
    int n = 0;
    ForEachField(*previous, [&](const auto& value) { before[n++] = AsInt(value); });
    // Axes `previous` lacks compare with zero.
    for (int k = n; k < kMaxFields; ++k) before[k] = 0;
    n = 0;
    ForEachField(s, [&](const auto& value) {
      const uint64_t difference = static_cast<uint64_t>(AsInt(value)) - static_cast<uint64_t>(before[n++]);
      out = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(
          WireFormatLite::ZigZagEncode64(static_cast<int64_t>(difference)), out);
    });
    previous = &s;
  }
  return out;
}

template <typename T>
void Assign(T& field, int64_t value) {
  field = static_cast<T>(value);
}

}  // namespace

static_assert(std::is_trivially_copyable_v<planner::Segment>, "segments are copied as plain memory");

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
  std::vector<planner::Segment>& block = open_[rank];
  if (block.empty()) block.reserve(kBlockSegments);
  block.push_back(segment);
  return block.size() == kBlockSegments ? Flush(rank) : absl::OkStatus();
}

absl::Status SegmentSpill::Flush(int32_t rank) {
  std::vector<planner::Segment>& block = open_[rank];
  if (block.empty()) return absl::OkStatus();
  encoded_.resize(block.size() * kMaxFields * kMaxVarintBytes);
  const char* data = reinterpret_cast<const char*>(encoded_.data());
  const int64_t bytes = Encode(block, encoded_.data()) - encoded_.data();
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
  blocks_[rank].push_back(Block{end_, bytes, static_cast<int64_t>(block.size())});
  end_ += bytes;
  block.clear();
  return absl::OkStatus();
}

absl::Status SegmentSpill::Finish() {
  for (int32_t rank = 0; rank < static_cast<int32_t>(open_.size()); ++rank) {
    SHARDSYNC_RETURN_IF_ERROR(Flush(rank));
    std::vector<planner::Segment>().swap(open_[rank]);
  }
  std::vector<uint8_t>().swap(encoded_);
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
    planner::Segment previous{};
    for (int64_t i = 0; i < b.count; ++i) {
      int64_t before[kMaxFields];
      int n = 0;
      ForEachField(previous, [&](const auto& value) { before[n++] = AsInt(value); });
      for (int k = n; k < kMaxFields; ++k) before[k] = 0;
      planner::Segment s{};
      bool ok = true;
      n = 0;
      // `axes`, read third, bounds the loop over the axes that follow it.
      ForEachField(s, [&](auto& field) {
        uint64_t zigzag = 0;
        ok = ok && in.ReadVarint64(&zigzag);
        const uint64_t difference = static_cast<uint64_t>(WireFormatLite::ZigZagDecode64(zigzag));
        Assign(field, static_cast<int64_t>(static_cast<uint64_t>(before[n++]) + difference));
        if (s.axes < 0 || s.axes > planner::kMaxAxes) {
          ok = false;
          s.axes = 0;
        }
      });
      if (!ok) return failed("a block does not decode");
      segments.push_back(s);
      previous = s;
    }
    if (in.CurrentPosition() != b.bytes) return failed("a block is longer than its segments");
  }
  return segments;
}

}  // namespace shardsync::coordinator
