// Limits shared by the daemons and the CLI: what one coordinator serves.
#pragma once

#include <cstdint>

namespace shardsync {

// The most agents (ranks 0..kMaxWorld-1) one coordinator serves.
inline constexpr int32_t kMaxWorld = 8192;

}  // namespace shardsync
