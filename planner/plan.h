// Planning: every target placement of every tensor intersected with the sources, each
// element assigned to exactly one source holder by the replica policy, as copy segments.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner/block_vector.h"
#include "planner/quantize.h"
#include "planner/types.h"

namespace shardsync::planner {

// A segment's extents and strides, in elements (see Segment).
using SegmentAxis = int32_t;
inline constexpr int64_t kMaxSegmentAxis = std::numeric_limits<SegmentAxis>::max();

// One strided copy: element i of `shape` moves from src_base + sum i_k*src_strides[k]
// of `src` to dst_base + sum i_k*dst_strides[k] of `dst` (offsets in elements of each
// side's dtype). Axes contiguous on both sides are merged, extent-1 axes dropped, so
// most segments are one run or one 2-D strided copy. Trivially copyable: plans of
// tens of millions of segments move as plain memory. Extents and strides take 32 bits
// (SegmentAxis), which keeps a segment at 88 bytes; ValidatePlanInput refuses tensors
// whose axes or strides do not fit.
//
// Even stages read sources: stage 0 every tensor but the block-quantized ones, stage
// 2g quantization group g (planner/quantize.h). Odd stage 2g+1 is the relay of stage
// 2g: it reads a target placement that stage 2g wrote (`src` is a target buffer,
// src_dtype the target dtype) and writes another target of the same node, so each
// element crosses the network once per node.
struct Segment {
  Holder src;
  Holder dst;
  int64_t src_base = 0;
  int64_t dst_base = 0;
  int32_t tensor = 0;  // index into PlanInput::tensors
  DType src_dtype = DType::kBFloat16;
  DType dst_dtype = DType::kBFloat16;
  int8_t axes = 0;   // entries used in the arrays below, >= 1
  int8_t stage = 0;  // even: from a source; odd: relayed from a target (see above)
  std::array<SegmentAxis, kMaxAxes> shape{};
  std::array<SegmentAxis, kMaxAxes> src_strides{};
  std::array<SegmentAxis, kMaxAxes> dst_strides{};
};

int64_t SegmentElements(const Segment& segment);
// What a segment puts on a link or writes: elements times the target element size.
int64_t SegmentBytes(const Segment& segment);

struct FillOp {
  int32_t tensor = 0;
  Fill fill;
  DType dtype = DType::kBFloat16;
};

// A fill as a segment whose source and target are both the filled region, for code
// that walks segments (a device writing zeros, verify reading them back).
Segment FillRegion(const FillOp& fill);

struct Plan {
  // Canonical order: by tensor, then target placement, then box. Every rank derives
  // its streams from this order, so senders and receivers agree without talking.
  BlockVector<Segment> segments;
  std::vector<FillOp> fills;
  std::vector<std::string> tensor_names;
  int32_t num_ranks = 0;              // one past the highest rank of any buffer
  int32_t stages = 1;                 // one past the highest stage of any segment
  std::vector<int32_t> node_of_rank;  // as planned (PlanInput::node_of_rank)
  // Block-quantized targets: each rank's scratch buffer (in no PlanInput) and what it
  // quantizes at the end of each stage, by stage.
  std::vector<Buffer> scratch;
  std::vector<QuantizeOp> quantizes;
};

// Stage s+1 of a rank runs after its stage s (see Segment).
inline constexpr int kMaxStages = 2 * kMaxQuantizeGroups;
// Whether stage `stage` relays targets an earlier stage wrote (see Segment).
inline bool IsRelayStage(int stage) { return stage % 2 == 1; }

// Chooses the source of a piece that several holders have. Changes only cost, never
// the bits written.
class ReplicaPolicy {
 public:
  virtual ~ReplicaPolicy() = default;
  virtual absl::string_view name() const = 0;
  // Returns an index into `candidate_ranks` (sorted by source placement order).
  // `sent_bytes[r]` is what rank r sends to other ranks so far in this batch.
  virtual size_t Choose(int32_t target_rank, absl::Span<const int32_t> candidate_ranks,
                        absl::Span<const int64_t> sent_bytes) const = 0;
};

// Same rank first (a local copy costs no link), then the holder that sends the fewest
// bytes so far over the whole batch, ties to the lowest rank.
std::unique_ptr<ReplicaPolicy> LocalFirstLeastLoaded();
// The first source placement that has the piece; for tests.
std::unique_ptr<ReplicaPolicy> FirstHolder();

// One side's description of a tensor, as a registering client gives it.
struct TensorSide {
  std::string name;
  Index shape;
  DType dtype = DType::kBFloat16;
  Layout layout;
  std::vector<BlockScales> scales = {};  // a target's: see TensorLayouts::target_scales
};

// Pairs every target tensor with its source by name. Refuses a target without a
// source, a shape mismatch and a dtype pair the sender cannot convert. Sources that no
// target names are left out (partial targets).
absl::StatusOr<std::vector<TensorLayouts>> MatchTensors(const std::vector<TensorSide>& sources,
                                                        const std::vector<TensorSide>& targets);

// The payload (type URL) an uncovered-target error carries: the tensor's name, so a
// caller that knows who registered what can say who is missing.
inline constexpr char kUncoveredTensorPayload[] = "type.shardsync/planner.UncoveredTensor";

struct PlanOptions {
  // Relay across nodes: where several target placements on one node hold the same box
  // (replicas of a shard) and no source of a piece of it is on that node, the piece
  // crosses the network once, into one of them (the relay: the one whose rank receives
  // the fewest bytes from other nodes so far), and the others copy it from the relay's
  // target in stage 1. Off, every target reads its own pieces from a source.
  bool relay = false;
  // Block-quantized targets: the bfloat16 scratch each rank may hold at once.
  int64_t scratch_bytes = kDefaultScratchBytes;
};

// Takes one tensor's segments, in canonical order; an error stops the planning.
using SegmentSink = std::function<absl::Status(absl::Span<const Segment>)>;

// Plans the whole batch, tensor by tensor: each tensor's segments go to `sink` once they
// are made and are not kept, so memory holds one tensor's at a time. The plan returned
// has everything but its segments. Two passes: the first covers every target and
// counts the bytes each rank must send (pieces only it holds), the second makes the
// segments, the policy choosing among the holders of a shared piece with those counted.
// Fails before the first tensor goes to `sink` on bad input or an uncovered target
// box, with the tensor, rank and box named.
absl::StatusOr<Plan> StreamPlan(const PlanInput& input, const ReplicaPolicy& policy, const PlanOptions& options,
                                const SegmentSink& sink);

// Plans the whole batch at once: StreamPlan, every segment kept. A piece that a holder on the target's own node has
// is read there (by the policy, among those holders): the network carries only what
// the node lacks. Block-quantized targets are planned as bfloat16 into scratch, in
// groups within options.scratch_bytes (planner/quantize.h).
absl::StatusOr<Plan> MakePlan(const PlanInput& input, const ReplicaPolicy& policy, const PlanOptions& options = {});

}  // namespace shardsync::planner
