#include "planner/box.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardsync::planner {

Box FullBox(const Index& shape) { return Box{Index(shape.size(), 0), shape}; }

bool IsEmpty(const Box& box) {
  for (size_t k = 0; k < box.lo.size(); ++k) {
    if (box.hi[k] <= box.lo[k]) return true;
  }
  return false;
}

int64_t Volume(const Box& box) {
  int64_t n = 1;
  for (size_t k = 0; k < box.lo.size(); ++k) n *= std::max<int64_t>(0, box.hi[k] - box.lo[k]);
  return n;
}

Index Extent(const Box& box) {
  Index extent(box.lo.size());
  for (size_t k = 0; k < box.lo.size(); ++k) extent[k] = box.hi[k] - box.lo[k];
  return extent;
}

Box Intersect(const Box& a, const Box& b) {
  Box out{a.lo, a.hi};
  for (size_t k = 0; k < a.lo.size(); ++k) {
    out.lo[k] = std::max(a.lo[k], b.lo[k]);
    out.hi[k] = std::min(a.hi[k], b.hi[k]);
  }
  return out;
}

bool Contains(const Box& outer, const Box& inner) {
  for (size_t k = 0; k < outer.lo.size(); ++k) {
    if (inner.lo[k] < outer.lo[k] || inner.hi[k] > outer.hi[k]) return false;
  }
  return true;
}

std::string BoxToString(const Box& box) {
  std::vector<std::string> axes;
  for (size_t k = 0; k < box.lo.size(); ++k) axes.push_back(absl::StrCat(box.lo[k], ":", box.hi[k]));
  return absl::StrCat("[", absl::StrJoin(axes, ", "), ")");
}

std::string IndexToString(const Index& index) { return absl::StrCat("[", absl::StrJoin(index, ", "), "]"); }

namespace {

// Recursive split of [begin, end) (flat offsets inside the sub-tensor of axes >= axis,
// whose leading coordinates are fixed in `prefix`).
void SplitFlat(const Index& shape, const Index& strides, size_t axis, int64_t begin, int64_t end, Box prefix,
               std::vector<Box>& out) {
  if (begin >= end) return;
  const int64_t row = strides[axis];  // elements per step along `axis`
  const int64_t first = begin / row, last = end / row;
  auto emit_full = [&](int64_t lo, int64_t hi) {
    Box box = prefix;
    box.lo[axis] = lo;
    box.hi[axis] = hi;
    for (size_t k = axis + 1; k < shape.size(); ++k) box.lo[k] = 0, box.hi[k] = shape[k];
    out.push_back(std::move(box));
  };
  auto recurse = [&](int64_t at, int64_t b, int64_t e) {
    Box box = prefix;
    box.lo[axis] = at;
    box.hi[axis] = at + 1;
    SplitFlat(shape, strides, axis + 1, b, e, std::move(box), out);
  };
  if (first == last) {  // within one step of this axis
    recurse(first, begin - first * row, end - first * row);
    return;
  }
  int64_t full_lo = first;
  if (begin % row != 0) {
    recurse(first, begin - first * row, row);
    full_lo = first + 1;
  }
  if (last > full_lo) emit_full(full_lo, last);
  if (end % row != 0) recurse(last, 0, end - last * row);
}

}  // namespace

std::vector<Box> FlatIntervalToBoxes(const Index& shape, int64_t begin, int64_t end) {
  std::vector<Box> out;
  if (begin >= end) return out;
  if (shape.empty()) {  // a scalar: one element
    out.push_back(Box{});
    return out;
  }
  SplitFlat(shape, ContiguousStrides(shape), 0, begin, end, FullBox(shape), out);
  return out;
}

}  // namespace shardsync::planner
