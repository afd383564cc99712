// What the calling thread has spent of a core so far: a wait that sleeps spends almost
// none of it, one that polls spends what it polled for.
#pragma once

#include <time.h>

#include <chrono>

namespace shardsync::testing {

inline std::chrono::nanoseconds ThreadCpu() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec);
}

}  // namespace shardsync::testing
