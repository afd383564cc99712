// Waits inside a sync poll before they sleep. A thread that sleeps pays a wake-up when
// its answer comes (the kernel's, and on a virtual machine the host's as well), and the
// longer it slept the dearer; one that polls does not. Each wait polls for at most
// kPollBeforeSleep, calling sched_yield between looks, then sleeps. A polling thread
// still takes its share of a core: waits beside copies that run on the host's cores
// do not poll.
#pragma once

#include <sched.h>

#include <chrono>

namespace shardsync {

inline constexpr std::chrono::milliseconds kPollBeforeSleep{50};

// How long a wait within a sync polls: not at all where some agent copies on its host's
// cores (`host_copies`), whose cores the polling would take.
inline std::chrono::steady_clock::duration SyncWaitPoll(bool host_copies) {
  return host_copies ? std::chrono::steady_clock::duration::zero()
                     : std::chrono::steady_clock::duration(kPollBeforeSleep);
}

// Calls `ready` until it returns true or `limit` has passed, yielding between calls;
// whether it returned true.
template <typename Ready>
bool PollFor(Ready&& ready, std::chrono::steady_clock::duration limit = kPollBeforeSleep) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    sched_yield();
  }
  return true;
}

}  // namespace shardsync
