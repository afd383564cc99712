#include "daemon/coordinator/segment_spill.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardsync::coordinator {

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
  if (block.bytes.capacity() < kBlockBytes) block.bytes.reserve(kBlockBytes + daemon::SegmentFieldsWriter::kMaxBytes);
  block.writer.Append(daemon::FieldsOf(segment), block.bytes);
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
      const bool full = error == ENOSPC || error == EDQUOT || error == EFBIG;  // the disk, a quota, ulimit -f
      return absl::Status(
          full ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInternal,
          absl::StrCat("writing the plan's file in '", directory_, "' at ", end_ + done, ": ", std::strerror(error)));
    }
    done += n;
  }
  blocks_[rank].push_back(Block{end_, bytes, block.count});
  end_ += bytes;
  block.bytes.clear();
  block.count = 0;
  block.writer = {};
  return absl::OkStatus();
}

absl::Status SegmentSpill::Finish() {
  for (int32_t rank = 0; rank < static_cast<int32_t>(open_.size()); ++rank) {
    SHARDSYNC_RETURN_IF_ERROR(Flush(rank));
    std::string().swap(open_[rank].bytes);
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
  std::string encoded;
  for (const Block& b : blocks_[rank]) {
    encoded.resize(b.bytes);
    for (int64_t done = 0; done < b.bytes;) {
      const ssize_t n = pread(fd_, encoded.data() + done, b.bytes - done, b.offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return failed(n < 0 ? std::strerror(errno) : "short file");
      done += n;
    }
    daemon::SegmentFieldsReader reader(encoded);
    daemon::SegmentFields fields;
    planner::Segment segment;
    for (int64_t i = 0; i < b.count; ++i) {
      if (absl::Status read = reader.Next(fields); !read.ok()) return failed(read.message());
      if (!daemon::FromFields(fields, segment)) return failed("a field outside its type");
      segments.push_back(segment);
    }
    if (!reader.done()) return failed("a block is longer than its segments");
  }
  return segments;
}

}  // namespace shardsync::coordinator
