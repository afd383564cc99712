// Limits shared by the daemons and the CLI: what one coordinator serves.
#pragma once

#include <cstdint>

namespace shardsync {

// The most agents (ranks 0..kMaxWorld-1) one coordinator serves.
inline constexpr int32_t kMaxWorld = 8192;

// The default bound on the tensors one rank holds (an agent's registrations together,
// one rank's publication): a 1T-parameter MoE checkpoint names about 100k per rank.
inline constexpr int64_t kDefaultMaxTensors = int64_t{1} << 21;

}  // namespace shardsync
