// Box arithmetic over half-open per-axis intervals.
#pragma once

#include <string>
#include <vector>

#include "planner/types.h"

namespace shardsync::planner {

Box FullBox(const Index& shape);
bool IsEmpty(const Box& box);
int64_t Volume(const Box& box);
Index Extent(const Box& box);
// The intersection; empty (IsEmpty) when the boxes do not meet.
Box Intersect(const Box& a, const Box& b);
bool Contains(const Box& outer, const Box& inner);
// "[0:4, 8:16)" style, for error messages.
std::string BoxToString(const Box& box);
std::string IndexToString(const Index& index);

// The boxes whose union is the flat row-major interval [begin, end) of a tensor of
// `shape`, in flat order: at most 2(N-1)+1 boxes.
std::vector<Box> FlatIntervalToBoxes(const Index& shape, int64_t begin, int64_t end);

}  // namespace shardsync::planner
