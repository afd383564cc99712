#include "tests/planner/reference_executor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace shardsync::testing {
namespace {

using planner::ChunkPart;
using planner::DType;
using planner::ElementBytes;
using planner::Segment;

// Offsets (elements) of element `flat` of a segment on each side.
void Locate(const Segment& s, int64_t flat, int64_t* src, int64_t* dst) {
  *src = s.src_base;
  *dst = s.dst_base;
  for (int k = s.axes - 1; k >= 0; --k) {
    const int64_t i = flat % s.shape[k];
    flat /= s.shape[k];
    *src += i * s.src_strides[k];
    *dst += i * s.dst_strides[k];
  }
}

// Writes one element of the target dtype, converting from the source dtype.
void Convert(const uint8_t* from, DType from_dtype, uint8_t* to, DType to_dtype) {
  if (from_dtype == to_dtype) {
    std::memcpy(to, from, ElementBytes(to_dtype));
    return;
  }
  uint32_t bits;  // the only conversion planned: float32 -> bfloat16
  std::memcpy(&bits, from, 4);
  const uint16_t half = Float32ToBFloat16(bits);
  std::memcpy(to, &half, 2);
}

absl::StatusOr<uint8_t*> At(HostBuffers& buffers, planner::Holder holder, int64_t element, int64_t element_bytes) {
  auto it = buffers.find(holder);
  const int64_t byte = element * element_bytes;
  if (it == buffers.end() || byte < 0 || byte + element_bytes > static_cast<int64_t>(it->second.size())) {
    return absl::OutOfRangeError(
        absl::StrCat("element ", element, " outside buffer ", holder.buffer, " on rank ", holder.rank));
  }
  return it->second.data() + byte;
}

absl::Status Pack(const planner::Plan& plan, const std::vector<ChunkPart>& parts, HostBuffers& buffers,
                  std::vector<uint8_t>& staging) {
  staging.clear();
  for (const ChunkPart& part : parts) {
    const Segment& s = plan.segments[part.segment];
    const int64_t out = ElementBytes(s.dst_dtype);
    for (int64_t e = part.begin; e < part.end; ++e) {
      int64_t src, dst;
      Locate(s, e, &src, &dst);
      SHARDSYNC_ASSIGN_OR_RETURN(auto from, At(buffers, s.src, src, ElementBytes(s.src_dtype)));
      staging.resize(staging.size() + out);
      Convert(from, s.src_dtype, staging.data() + staging.size() - out, s.dst_dtype);
    }
  }
  return absl::OkStatus();
}

absl::Status Unpack(const planner::Plan& plan, const std::vector<ChunkPart>& parts, HostBuffers& buffers,
                    const std::vector<uint8_t>& staging) {
  size_t at = 0;
  for (const ChunkPart& part : parts) {
    const Segment& s = plan.segments[part.segment];
    const int64_t bytes = ElementBytes(s.dst_dtype);
    for (int64_t e = part.begin; e < part.end; ++e) {
      int64_t src, dst;
      Locate(s, e, &src, &dst);
      SHARDSYNC_ASSIGN_OR_RETURN(auto to, At(buffers, s.dst, dst, bytes));
      if (at + bytes > staging.size()) return absl::InternalError("receive chunk is longer than the sent chunk");
      std::memcpy(to, staging.data() + at, bytes);
      at += bytes;
    }
  }
  if (at != staging.size()) return absl::InternalError("receive chunk is shorter than the sent chunk");
  return absl::OkStatus();
}

}  // namespace

uint16_t Float32ToBFloat16(uint32_t bits) {
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0)
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

HostBuffers AllocateBuffers(const planner::PlanInput& input) {
  HostBuffers buffers;
  for (const planner::Buffer& b : input.buffers) buffers[b.holder].assign(b.bytes, 0);
  return buffers;
}

absl::StatusOr<ExecutionStats> Execute(const planner::Plan& plan, const std::vector<planner::Schedule>& schedules,
                                       int64_t staging_bytes, HostBuffers& buffers) {
  ExecutionStats stats;
  std::vector<uint8_t> staging;
  for (const planner::Schedule& schedule : schedules) {
    stats.rounds = std::max(stats.rounds, schedule.rounds());
    if (static_cast<int32_t>(schedule.stages.size()) != plan.stages) {
      return absl::InternalError(
          absl::StrCat("rank ", schedule.rank, " has ", schedule.stages.size(), " stages of ", plan.stages));
    }
  }
  for (int32_t k = 0; k < plan.stages; ++k) {
    // A stage reads the buffers as the stages before it left them: what it writes
    // itself is invisible to its own reads, so a relay that read a target written in
    // its own stage reads poison and fails the check.
    HostBuffers readable = buffers;
    for (const planner::Schedule& schedule : schedules) {
      const planner::Stage& stage = schedule.stages[k];
      for (int32_t index : stage.local_segments) {
        const Segment& s = plan.segments[index];
        const std::vector<ChunkPart> whole{{index, 0, planner::SegmentElements(s)}};
        SHARDSYNC_RETURN_IF_ERROR(Pack(plan, whole, readable, staging));
        SHARDSYNC_RETURN_IF_ERROR(Unpack(plan, whole, buffers, staging));
        stats.local_bytes += static_cast<int64_t>(staging.size());
      }
      if (k > 0) continue;
      for (int32_t index : schedule.fills) {
        const planner::FillOp& f = plan.fills[index];
        for (int64_t e = 0; e < planner::NumElements(f.fill.shape); ++e) {
          int64_t dst = f.fill.base;
          int64_t flat = e;
          for (int d = static_cast<int>(f.fill.shape.size()) - 1; d >= 0; --d) {
            dst += (flat % f.fill.shape[d]) * f.fill.strides[d];
            flat /= f.fill.shape[d];
          }
          SHARDSYNC_ASSIGN_OR_RETURN(auto to, At(buffers, f.fill.holder, dst, ElementBytes(f.dtype)));
          std::memset(to, 0, ElementBytes(f.dtype));
        }
      }
    }
    // Receiver streams by (receiver, sender), to pair chunk k of both ends.
    std::map<std::pair<int32_t, int32_t>, const planner::PeerStream*> receives;
    int32_t rounds = 0;
    for (const planner::Schedule& schedule : schedules) {
      const planner::Stage& stage = schedule.stages[k];
      for (const planner::PeerStream& stream : stage.receives) receives[{schedule.rank, stream.peer}] = &stream;
      rounds = std::max(rounds, stage.rounds);
    }
    for (int32_t round = 0; round < rounds; ++round) {
      for (const planner::Schedule& schedule : schedules) {
        for (const planner::PeerStream& send : schedule.stages[k].sends) {
          if (round >= static_cast<int32_t>(send.chunks.size())) continue;
          auto it = receives.find({send.peer, schedule.rank});
          if (it == receives.end() || round >= static_cast<int32_t>(it->second->chunks.size())) {
            return absl::InternalError(absl::StrCat("rank ", send.peer, " posts no receive for round ", round,
                                                    " of stage ", k, " from rank ", schedule.rank));
          }
          const planner::Chunk& chunk = send.chunks[round];
          SHARDSYNC_RETURN_IF_ERROR(Pack(plan, planner::ChunkParts(plan, send, chunk), readable, staging));
          if (static_cast<int64_t>(staging.size()) > planner::MaxChunkBytes(staging_bytes) ||
              static_cast<int64_t>(staging.size()) != chunk.bytes) {
            return absl::InternalError(absl::StrCat("chunk of ", staging.size(), " bytes breaks the slot of ",
                                                    planner::MaxChunkBytes(staging_bytes), " or its own size ",
                                                    chunk.bytes));
          }
          stats.peak_staging_bytes = std::max<int64_t>(stats.peak_staging_bytes, staging.size());
          stats.sent_bytes += static_cast<int64_t>(staging.size());
          const std::vector<ChunkPart> received = planner::ChunkParts(plan, *it->second, it->second->chunks[round]);
          SHARDSYNC_RETURN_IF_ERROR(Unpack(plan, received, buffers, staging));
        }
      }
    }
  }
  return stats;
}

}  // namespace shardsync::testing
