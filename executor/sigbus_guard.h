// Host shared memory another process can shrink under our mapping: touching a lost page
// raises SIGBUS, which would kill the agent. A watched range instead has its mapping
// replaced by private zero pages on the first such fault, the access completes, and the
// range is marked faulted; whoever owns the range checks `Faulted` after using it and
// fails what it was doing, naming the memory. Faults outside every watched range keep
// the default action (the process dies as before).
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace shardsync::executor {

class SigbusGuard {
 public:
  // The most ranges watched at once, in the whole process.
  static constexpr int kCapacity = 1 << 16;

  // Watches the page-aligned mapping [start, start + length); installs the handler on
  // first use. RESOURCE_EXHAUSTED past kCapacity ranges.
  static absl::StatusOr<int> Watch(void* start, size_t length);
  // Stops watching; call before the range is unmapped.
  static void Unwatch(int slot);
  // Whether a fault in the range replaced its mapping: it no longer shows the object.
  static bool Faulted(int slot);
};

}  // namespace shardsync::executor
