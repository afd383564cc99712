// Core vocabulary of the planner: dtypes, boxes, holders, placements, layouts.
// Pure data; every size is in elements unless the name says bytes.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"

namespace shardsync::planner {

// Tensors of more axes than this are refused with a clear error (weights are <= 4-D).
inline constexpr int kMaxAxes = 4;

enum class DType : uint8_t { kFloat32, kBFloat16, kFloat16, kFloat8E4M3, kFloat8E5M2, kInt64, kInt32, kInt8, kUInt8 };

int64_t ElementBytes(DType dtype);
absl::string_view DTypeName(DType dtype);
// Same dtype, or a conversion the sender performs while packing (float32 -> bfloat16).
bool CanConvert(DType from, DType to);

// Per-axis sizes, coordinates or strides, in elements.
using Index = absl::InlinedVector<int64_t, kMaxAxes>;

// A half-open box of a tensor: axis k spans [lo[k], hi[k]).
struct Box {
  Index lo;
  Index hi;
  friend bool operator==(const Box& a, const Box& b) { return a.lo == b.lo && a.hi == b.hi; }
  template <typename H>
  friend H AbslHashValue(H h, const Box& b) {
    return H::combine(std::move(h), b.lo, b.hi);
  }
};

// A registered buffer on one agent. Ranks are global agent ranks; buffer ids are
// unique within a rank.
struct Holder {
  int32_t rank = 0;
  int32_t buffer = 0;
  friend bool operator==(Holder a, Holder b) { return a.rank == b.rank && a.buffer == b.buffer; }
  friend bool operator<(Holder a, Holder b) { return a.rank != b.rank ? a.rank < b.rank : a.buffer < b.buffer; }
};

struct Buffer {
  Holder holder;
  int64_t bytes = 0;
  std::string name;  // as registered, for messages; empty: named by its id
};

// Where a box of a tensor lives: element i of the box is at
// base + sum_k (i_k - box.lo[k]) * strides[k] (elements of the tensor's dtype).
struct Placement {
  Box box;
  Holder holder;
  int64_t base = 0;
  Index strides;
};

// Target elements that have no source (padded vocabulary rows): written with zeros.
struct Fill {
  Holder holder;
  int64_t base = 0;
  Index shape;
  Index strides;
};

struct Layout {
  std::vector<Placement> placements;
  std::vector<Fill> fills;  // targets only
};

// The float32 scales of one block-quantized target placement (planner/quantize.h):
// the scale of block (i, j) of the placement's rows x cols is at
// base + i * row_stride + j of `holder`, on the placement's rank.
struct BlockScales {
  Holder holder;
  int64_t base = 0;
  int64_t row_stride = 0;
};

// One tensor to move: its logical shape, the dtype on each side, and both layouts.
struct TensorLayouts {
  std::string name;
  Index shape;
  DType source_dtype = DType::kBFloat16;
  DType target_dtype = DType::kBFloat16;
  Layout source;
  Layout target;
  // A FLOAT8_E4M3 target quantized in 128 x 128 blocks: the scales of every target
  // placement, in the same order. Empty for every other target.
  std::vector<BlockScales> target_scales = {};
};

// A whole batch: every buffer the layouts name, and every tensor.
struct PlanInput {
  std::vector<Buffer> buffers;
  std::vector<TensorLayouts> tensors;
  // The node of every rank, by rank: ranks of one node share fast links (NVLink);
  // bytes between nodes cross the network. Empty: every rank on one node.
  std::vector<int32_t> node_of_rank;
};

// One past the highest rank of any buffer: the ranks the input spans.
int32_t NumRanks(const PlanInput& input);

// "buffer 'NAME' on rank R" (or "buffer ID on rank R" when it has no name), for messages.
std::string BufferLabel(const PlanInput& input, Holder holder);

// Row-major contiguous strides of `shape`.
Index ContiguousStrides(const Index& shape);
int64_t NumElements(const Index& shape);
// Elements per index of `axis`: the product of every other axis (0-sized tensors too).
int64_t ElementsPerIndex(const Index& shape, int axis);

}  // namespace shardsync::planner
