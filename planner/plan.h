// Planning: every target placement of every tensor intersected with the sources, each
// element assigned to exactly one source holder by the replica policy, as copy segments.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "planner/block_vector.h"
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
// Stage 0 reads sources. Stage 1 is the relay: it reads a target placement that stage
// 0 wrote (`src` is a target buffer, src_dtype the target dtype) and writes another
// target of the same node, so each element crosses the network once per node.
struct Segment {
  Holder src;
  Holder dst;
  int64_t src_base = 0;
  int64_t dst_base = 0;
  int32_t tensor = 0;  // index into PlanInput::tensors
  DType src_dtype = DType::kBFloat16;
  DType dst_dtype = DType::kBFloat16;
  int8_t axes = 0;   // entries used in the arrays below, >= 1
  int8_t stage = 0;  // 0: from a source; 1: relayed from a target stage 0 wrote
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
  int32_t stages = 1;                 // 2 when some segment is relayed
  std::vector<int32_t> node_of_rank;  // as planned (PlanInput::node_of_rank)
};

// Stage s+1 of a rank runs after its stage s (see Segment).
inline constexpr int kMaxStages = 2;

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
};

// Plans the whole batch at once. Fails before anything is planned on bad input, with
// the tensor, rank and box named. A piece that a holder on the target's own node has
// is read there (by the policy, among those holders): the network carries only what
// the node lacks.
absl::StatusOr<Plan> MakePlan(const PlanInput& input, const ReplicaPolicy& policy, const PlanOptions& options = {});

}  // namespace shardsync::planner
