// Test helper: one rank's BufferTable over the reference executor's host buffers.
#pragma once

#include "executor/device.h"
#include "tests/planner/reference_executor.h"

namespace shardsync::executor {

inline BufferTable TableFor(int32_t rank, testing::HostBuffers& buffers) {
  BufferTable table;
  for (auto& [holder, bytes] : buffers) {
    if (holder.rank != rank) continue;
    if (static_cast<int32_t>(table.size()) <= holder.buffer) table.resize(holder.buffer + 1, nullptr);
    table[holder.buffer] = bytes.data();
  }
  return table;
}

}  // namespace shardsync::executor
