// Names for what a test makes where other processes see it (shared memory, /tmp).
#pragma once

#include <unistd.h>

#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace shardsync::testing {

// `prefix` and a token of this process that no other running process shares: the pid
// alone repeats when a test runs several times at once, each run in a Bazel sandbox of
// its own pid namespace.
inline std::string UniqueName(absl::string_view prefix) {
  static const std::string token = absl::StrCat(getpid(), "-", std::random_device()());
  return absl::StrCat(prefix, token);
}

}  // namespace shardsync::testing
