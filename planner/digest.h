// The identity of a plan: the same on every rank and every run for the same plan.
#pragma once

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "planner/plan.h"

namespace shardsync::planner {

// A 128-bit digest of the plan and its staging budget, as 32 hex digits: equal on every
// rank and every run for the same plan. Not cryptographic.
std::string PlanDigest(const Plan& plan, int64_t staging_bytes);

// PlanDigest of a plan whose segments come in pieces, in plan order (StreamPlan's sink):
// Add them as they come, then Finish with the plan (every field but its segments read).
class PlanDigester {
 public:
  void Add(absl::Span<const Segment> segments);
  std::string Finish(const Plan& plan, int64_t staging_bytes) const;

 private:
  // Two independent 64-bit lanes, each mixing one word at a time (splitmix64 finalizer).
  class Lanes {
   public:
    void Add(uint64_t value);
    void Add(int64_t value) { Add(static_cast<uint64_t>(value)); }
    void Add(const Lanes& other);  // folds another digest in
    std::string Hex() const;

   private:
    uint64_t a_ = 0xcbf29ce484222325ULL;
    uint64_t b_ = 0x84222325cbf29ce4ULL;
  };
  // Even and odd segments in separate digests: two chains of multiplies run side by side.
  Lanes even_, odd_;
  uint64_t segments_ = 0;
};

}  // namespace shardsync::planner
