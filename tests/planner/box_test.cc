#include "planner/box.h"

#include <catch2/catch.hpp>
#include <random>

namespace shardsync::planner {
namespace {

TEST_CASE("intersecting boxes gives the common part, or an empty box when apart") {
  const Box a{{0, 2}, {4, 6}};
  const Box b{{3, 0}, {8, 3}};
  CHECK(Intersect(a, b) == Box{{3, 2}, {4, 3}});
  CHECK(Volume(Intersect(a, b)) == 1);
  CHECK(IsEmpty(Intersect(a, Box{{4, 0}, {5, 9}})));
  CHECK(Contains(Box{{0, 0}, {4, 6}}, a));
  CHECK_FALSE(Contains(a, b));
  CHECK(BoxToString(a) == "[0:4, 2:6)");
}

TEST_CASE("a flat interval becomes at most 2(N-1)+1 boxes that cover exactly it, in order") {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 500; ++trial) {
    Index shape;
    const int axes = 1 + trial % 4;
    for (int k = 0; k < axes; ++k) shape.push_back(1 + rng() % 6);
    const int64_t n = NumElements(shape);
    int64_t begin = rng() % (n + 1), end = rng() % (n + 1);
    if (begin > end) std::swap(begin, end);
    const std::vector<Box> boxes = FlatIntervalToBoxes(shape, begin, end);
    INFO("shape " << IndexToString(shape) << " [" << begin << ", " << end << ")");
    CHECK(boxes.size() <= static_cast<size_t>(2 * (axes - 1) + 1));
    // Walk the boxes' elements in order: they must be begin, begin+1, ..., end-1.
    const Index strides = ContiguousStrides(shape);
    int64_t expect = begin;
    for (const Box& box : boxes) {
      Index i = box.lo;
      while (true) {
        int64_t flat = 0;
        for (int k = 0; k < axes; ++k) flat += i[k] * strides[k];
        REQUIRE(flat == expect++);
        int k = axes - 1;
        while (k >= 0 && ++i[k] == box.hi[k]) i[k] = box.lo[k], --k;
        if (k < 0) break;
      }
    }
    CHECK(expect == end);
  }
}

}  // namespace
}  // namespace shardsync::planner
