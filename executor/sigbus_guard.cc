#include "executor/sigbus_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"

namespace shardsync::executor {
namespace {

// Read by the handler without locks: a slot is in use while `length` is non-zero, and
// `start` is written before `length` is published.
struct Slot {
  std::atomic<uintptr_t> start{0};
  std::atomic<size_t> length{0};
  std::atomic<bool> faulted{false};
};

std::array<Slot, SigbusGuard::kCapacity> slots;
std::atomic<int> slots_used{0};  // every slot in use lies below this index
std::mutex watch_mu;             // orders Watch and Unwatch; never taken by the handler
struct sigaction previous {};

void OnSigbus(int signal, siginfo_t* info, void* context) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  const int used = slots_used.load(std::memory_order_acquire);
  for (int k = 0; k < used; ++k) {
    const size_t length = slots[k].length.load(std::memory_order_acquire);
    const uintptr_t start = slots[k].start.load(std::memory_order_relaxed);
    if (length == 0 || address < start || address - start >= length) continue;
    // Zero pages in place of the lost ones; the faulting access runs again on them.
    const int saved = errno;
    void* replaced = mmap(reinterpret_cast<void*>(start), length, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    errno = saved;
    if (replaced != MAP_FAILED) {
      slots[k].faulted.store(true, std::memory_order_release);
      return;
    }
    break;
  }
  // Not ours: what was there before decides (by default the process dies on return).
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction != nullptr) return previous.sa_sigaction(signal, info, context);
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    return previous.sa_handler(signal);
  }
  sigaction(SIGBUS, &previous, nullptr);
}

void InstallOnce() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction action {};
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    sigaction(SIGBUS, &action, &previous);
  });
}

// Slots given back by Unwatch, taken first; guarded by watch_mu.
std::vector<int>& FreeSlots() {
  static auto* free_slots = new std::vector<int>();
  return *free_slots;
}

}  // namespace

absl::StatusOr<int> SigbusGuard::Watch(void* start, size_t length) {
  InstallOnce();
  std::lock_guard<std::mutex> lock(watch_mu);
  int k = slots_used.load(std::memory_order_relaxed);
  if (!FreeSlots().empty()) {
    k = FreeSlots().back();
    FreeSlots().pop_back();
  } else if (k == kCapacity) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this process maps ", kCapacity, " host shared memory ranges already"));
  }
  slots[k].faulted.store(false, std::memory_order_relaxed);
  slots[k].start.store(reinterpret_cast<uintptr_t>(start), std::memory_order_relaxed);
  slots[k].length.store(length, std::memory_order_release);
  if (k == slots_used.load(std::memory_order_relaxed)) slots_used.store(k + 1, std::memory_order_release);
  return k;
}

void SigbusGuard::Unwatch(int slot) {
  std::lock_guard<std::mutex> lock(watch_mu);
  slots[slot].length.store(0, std::memory_order_release);
  FreeSlots().push_back(slot);
}

bool SigbusGuard::Faulted(int slot) { return slots[slot].faulted.load(std::memory_order_acquire); }

}  // namespace shardsync::executor
