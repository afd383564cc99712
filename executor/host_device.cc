#include <algorithm>
#include <cstring>

#include "absl/time/clock.h"
#include "executor/block_quantize.h"
#include "executor/device.h"
#include "executor/host_copy.h"

namespace shardsync::executor {
namespace {

// How far ahead of its reads the hash loop prefetches: a piece may lie cold in a
// registered buffer, and the loop's reads alone leave the processor waiting on memory.
constexpr int64_t kPrefetchBytes = 2048;

// Whole segments, each from its source to its target as `buffers` map them.
void CopySegments(const planner::Plan& plan, absl::Span<const int32_t> segments, const BufferTable& buffers) {
  for (int32_t index : segments) {
    const planner::Segment& s = plan.segments[index];
    CopyHost(s, buffers[s.src.buffer], buffers[s.dst.buffer]);
  }
}

}  // namespace

absl::StatusOr<uint8_t*> HostDevice::Staging(int32_t peer, bool send, int slot, int64_t bytes) {
  StagingBuffer& staging = staging_[{peer, send, slot}];
  if (staging.bytes != bytes) staging = {std::unique_ptr<uint8_t[]>(new uint8_t[bytes]), bytes};
  return staging.data.get();
}

absl::Status HostDevice::ReleaseStaging(int32_t peer, bool send) {
  for (int slot = 0; slot < planner::kStagingSlots; ++slot) staging_.erase({peer, send, slot});
  return absl::OkStatus();
}

absl::Status HostDevice::Pack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                              const BufferTable& buffers, uint8_t* out, int) {
  for (const planner::ChunkPart& part : parts) {
    const planner::Segment& s = plan.segments[part.segment];
    PackHost(s, part.begin, part.end, buffers[s.src.buffer], out);
    out += (part.end - part.begin) * planner::ElementBytes(s.dst_dtype);
  }
  return absl::OkStatus();
}

absl::Status HostDevice::Gather(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                                const BufferTable& buffers, uint8_t* out, int) {
  for (const planner::ChunkPart& part : parts) {
    const planner::Segment& s = plan.segments[part.segment];
    GatherHost(s, part.begin, part.end, buffers[s.dst.buffer], out);
    out += (part.end - part.begin) * planner::ElementBytes(s.dst_dtype);
  }
  return absl::OkStatus();
}

absl::Status HostDevice::Unpack(const planner::Plan& plan, absl::Span<const planner::ChunkPart> parts,
                                const uint8_t* in, const BufferTable& buffers, int) {
  for (const planner::ChunkPart& part : parts) {
    const planner::Segment& s = plan.segments[part.segment];
    UnpackHost(s, part.begin, part.end, in, buffers[s.dst.buffer]);
    in += (part.end - part.begin) * planner::ElementBytes(s.dst_dtype);
  }
  return absl::OkStatus();
}

absl::Status HostDevice::CopyLocal(const planner::Plan& plan, absl::Span<const int32_t> segments,
                                   absl::Span<const int32_t> fills, const BufferTable& buffers) {
  const absl::Time start = absl::Now();
  CopySegments(plan, segments, buffers);
  for (int32_t index : fills) FillHost(plan.fills[index], buffers[plan.fills[index].fill.holder.buffer]);
  local_seconds_ += absl::ToDoubleSeconds(absl::Now() - start);
  return absl::OkStatus();
}

absl::Status HostDevice::Quantize(const planner::Plan& plan, absl::Span<const int32_t> quantizes,
                                  const BufferTable& buffers) {
  for (int32_t index : quantizes) {
    const planner::QuantizeOp& q = plan.quantizes[index];
    QuantizeHost(q, buffers[q.scratch.buffer], buffers[q.target.buffer], buffers[q.scale.buffer]);
  }
  return absl::OkStatus();
}

absl::Status HostDevice::CopyDirect(const planner::Plan& plan, absl::Span<const int32_t> segments,
                                    const BufferTable& buffers) {
  CopySegments(plan, segments, buffers);
  return absl::OkStatus();
}

absl::Status HostDevice::QueueHashes(absl::Span<const HashPiece> pieces) {
  for (const HashPiece& p : pieces) {
    const uint8_t* bytes = p.data;
    const int64_t whole = p.bytes / 8;
    uint64_t sum = 0;
    for (int64_t w = 0; w < whole; ++w) {
      if (w % 8 == 0) __builtin_prefetch(bytes + w * 8 + kPrefetchBytes);
      uint64_t word;
      std::memcpy(&word, bytes + w * 8, 8);  // one load: the size is known
      sum += WordHash(static_cast<uint64_t>(p.first_word + w), word);
    }
    if (p.bytes % 8 != 0) {
      uint64_t tail = 0;  // zero-padded
      std::memcpy(&tail, bytes + whole * 8, static_cast<size_t>(p.bytes % 8));
      sum += WordHash(static_cast<uint64_t>(p.first_word + whole), tail);
    }
    hash_sums_.push_back(sum);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> HostDevice::CollectHashes() {
  std::vector<uint64_t> sums;
  sums.swap(hash_sums_);
  return sums;
}

}  // namespace shardsync::executor
