#include "planner/types.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardsync::planner {
namespace {

struct DTypeInfo {
  DType dtype;
  absl::string_view name;
  int64_t bytes;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "float32", 4},
    {DType::kBFloat16, "bfloat16", 2},
    {DType::kFloat16, "float16", 2},
    {DType::kFloat8E4M3, "float8_e4m3", 1},
    {DType::kFloat8E5M2, "float8_e5m2", 1},
    {DType::kInt64, "int64", 8},
    {DType::kInt32, "int32", 4},
    {DType::kInt8, "int8", 1},
    {DType::kUInt8, "uint8", 1},
};

const DTypeInfo& Info(DType dtype) { return kDTypes[static_cast<int>(dtype)]; }

}  // namespace

int64_t ElementBytes(DType dtype) { return Info(dtype).bytes; }
absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

bool CanConvert(DType from, DType to) { return from == to || (from == DType::kFloat32 && to == DType::kBFloat16); }

Index ContiguousStrides(const Index& shape) {
  Index strides(shape.size(), 1);
  for (int k = static_cast<int>(shape.size()) - 2; k >= 0; --k) strides[k] = strides[k + 1] * shape[k + 1];
  return strides;
}

int64_t NumElements(const Index& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t ElementsPerIndex(const Index& shape, int axis) {
  int64_t n = 1;
  for (int k = 0; k < static_cast<int>(shape.size()); ++k) {
    if (k != axis) n *= shape[k];
  }
  return n;
}

int32_t NumRanks(const PlanInput& input) {
  int32_t ranks = 0;
  for (const Buffer& b : input.buffers) ranks = std::max(ranks, b.holder.rank + 1);
  return ranks;
}

std::string BufferLabel(const PlanInput& input, Holder holder) {
  for (const Buffer& b : input.buffers) {
    if (b.holder == holder && !b.name.empty()) return absl::StrCat("buffer '", b.name, "' on rank ", holder.rank);
  }
  return absl::StrCat("buffer ", holder.buffer, " on rank ", holder.rank);
}

}  // namespace shardsync::planner
