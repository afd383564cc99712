#include "executor/signal_board.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "executor/sigbus_guard.h"

namespace shardsync::executor {
namespace {

constexpr uint64_t kMagic = 0x5353'424f'4152'4431ULL;  // "SSBOARD1": this layout
constexpr absl::string_view kPrefix = "shardsync-board-";
constexpr absl::Duration kCheckEvery = absl::Milliseconds(1);  // aborts are seen this soon

struct Message {
  std::atomic<uint64_t> sync;  // 0: void
  std::atomic<int32_t> round;
  std::atomic<uint32_t> value;
};

struct alignas(64) Header {
  uint64_t magic;
  int32_t ranks;
  uint32_t depth;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "the board's counters are shared between processes");

// Waits while `*word == expected`, at most until `until` and never longer than
// kCheckEvery: before `sleep_from` by yielding the core once (the caller looks again),
// after it on a futex between processes (no FUTEX_PRIVATE_FLAG).
void WaitWhile(std::atomic<uint32_t>& word, uint32_t expected, absl::Time until, absl::Time sleep_from) {
  if (absl::Now() < sleep_from) {
    sched_yield();
    return;
  }
  const absl::Duration left = std::min(kCheckEvery, until - absl::Now());
  if (left <= absl::ZeroDuration()) return;
  const timespec timeout = absl::ToTimespec(left);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

void WakeAll(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

struct SignalBoard::Ring {
  std::atomic<uint32_t> written;  // by the sender
  std::atomic<uint32_t> taken;    // by the board's owner
  Message messages[kRingDepth];
};

namespace {
constexpr size_t kBoardBytes = sizeof(Header) + sizeof(SignalBoard::Ring) * kBoardRanks;
}  // namespace

uint64_t SyncKey(absl::string_view sync_id) {
  uint64_t hash = 0xcbf29ce484222325ULL;  // FNV-1a: the same in every process
  for (unsigned char c : sync_id) hash = (hash ^ c) * 0x100000001b3ULL;
  return hash == 0 ? 1 : hash;
}

std::string SignalBoard::NameFor(absl::string_view incarnation) { return absl::StrCat("/", kPrefix, incarnation); }

int SignalBoard::RemoveOrphans() {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return 0;
  int removed = 0;
  while (const dirent* entry = readdir(dir)) {
    absl::string_view name = entry->d_name;
    if (!absl::ConsumePrefix(&name, kPrefix)) continue;
    const std::string path = absl::StrCat("/", entry->d_name);
    const int fd = shm_open(path.c_str(), O_RDWR, 0);
    if (fd < 0) continue;
    // Unlocked and complete (the magic is written under the lock): its owner is gone.
    // One being created holds no lock for an instant, but has no magic yet.
    Header header{};
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && pread(fd, &header, sizeof(header), 0) == sizeof(header) &&
        header.magic == kMagic && shm_unlink(path.c_str()) == 0) {
      ++removed;
    }
    close(fd);  // releases the lock
  }
  closedir(dir);
  return removed;
}

absl::StatusOr<std::unique_ptr<SignalBoard>> SignalBoard::Create(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("creating signal board ", name, ": ", strerror(errno)));
  // Held until this process ends: waits out another agent's orphan check of this name.
  void* base = MAP_FAILED;
  // Allocated now, not at a peer's first write: a full /dev/shm fails here, not with a
  // SIGBUS in the peer.
  int error = flock(fd, LOCK_EX) == 0 ? posix_fallocate(fd, 0, kBoardBytes) : errno;
  if (error == 0) {
    base = mmap(nullptr, kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) error = errno;
  }
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    close(fd);
    return absl::UnavailableError(absl::StrCat("sizing signal board ", name, ": ", strerror(error)));
  }
  // A fresh object reads as zeros: every ring empty. The magic is the last write.
  const absl::StatusOr<int> watch = SigbusGuard::Watch(base, kBoardBytes);
  if (!watch.ok()) {
    munmap(base, kBoardBytes);
    shm_unlink(name.c_str());
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat("signal board ", name, ": ", watch.status().message()));
  }
  auto* header = static_cast<Header*>(base);
  header->ranks = kBoardRanks;
  header->depth = kRingDepth;
  std::atomic_thread_fence(std::memory_order_release);
  header->magic = kMagic;
  return std::unique_ptr<SignalBoard>(new SignalBoard(name, base, *watch, fd));
}

absl::StatusOr<std::unique_ptr<SignalBoard>> SignalBoard::Open(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("opening signal board ", name, ": ", strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != kBoardBytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(name, " is not a signal board of this version (", st.st_size, " bytes, not ", kBoardBytes, ")"));
  }
  void* base = mmap(nullptr, kBoardBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int error = errno;
  close(fd);
  if (base == MAP_FAILED)
    return absl::UnavailableError(absl::StrCat("mapping signal board ", name, ": ", strerror(error)));
  const absl::StatusOr<int> watch = SigbusGuard::Watch(base, kBoardBytes);
  if (!watch.ok()) {
    munmap(base, kBoardBytes);
    return absl::ResourceExhaustedError(absl::StrCat("signal board ", name, ": ", watch.status().message()));
  }
  const auto* header = static_cast<const Header*>(base);
  if (header->magic != kMagic || header->ranks != kBoardRanks || header->depth != kRingDepth) {
    SigbusGuard::Unwatch(*watch);
    munmap(base, kBoardBytes);
    return absl::FailedPreconditionError(absl::StrCat(name, " is not a signal board of this version"));
  }
  return std::unique_ptr<SignalBoard>(new SignalBoard(name, base, *watch, /*owner_fd=*/-1));
}

absl::StatusOr<MemorySpan> SignalBoard::span() const {
  struct stat info {};
  if (owner_fd_ < 0 || fstat(owner_fd_, &info) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("signal board ", name_, " is not this agent's"));
  }
  return MemorySpan{ShmObject(info.st_dev, info.st_ino), 0, kBoardBytes};
}

SignalBoard::~SignalBoard() {
  SigbusGuard::Unwatch(watch_);
  munmap(base_, kBoardBytes);
  if (owner_fd_ >= 0) {
    shm_unlink(name_.c_str());
    close(owner_fd_);
  }
}

absl::Status SignalBoard::CheckSender(int32_t from) {
  if (from >= 0 && from < kBoardRanks) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("rank ", from, " is beyond a signal board's ", kBoardRanks));
}

SignalBoard::Ring& SignalBoard::RingOf(int32_t from) const {
  return reinterpret_cast<Ring*>(static_cast<uint8_t*>(base_) + sizeof(Header))[from];
}

absl::Status SignalBoard::Post(int32_t from, SignalKey key, uint8_t value, absl::Time deadline, absl::Duration poll_for,
                               const std::function<bool()>& aborted, const std::function<void()>& meanwhile) {
  SHARDSYNC_RETURN_IF_ERROR(CheckSender(from));
  Ring& ring = RingOf(from);
  const uint32_t written = ring.written.load(std::memory_order_relaxed);  // only this sender writes it
  // This sender's untaken messages of other syncs are of syncs it has left: void them
  // before waiting for room, which their reader then makes by dropping them.
  for (uint32_t i = ring.taken.load(std::memory_order_acquire); i != written; ++i) {
    Message& old = ring.messages[i % kRingDepth];
    uint64_t sync = old.sync.load(std::memory_order_relaxed);
    if (sync != key.sync) old.sync.compare_exchange_strong(sync, 0, std::memory_order_relaxed);
  }
  const absl::Time sleep_from = absl::Now() + poll_for;
  for (uint32_t taken = ring.taken.load(std::memory_order_acquire); written - taken >= kRingDepth;
       taken = ring.taken.load(std::memory_order_acquire)) {
    if (aborted()) return absl::AbortedError("aborted while the receiver's ring was full");
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat("its ring on board ", name_, " stayed full until the deadline"));
    }
    meanwhile();
    WaitWhile(ring.taken, taken, deadline, sleep_from);
  }
  Message& message = ring.messages[written % kRingDepth];
  message.round.store(key.round, std::memory_order_relaxed);
  message.value.store(value, std::memory_order_relaxed);
  message.sync.store(key.sync, std::memory_order_relaxed);
  ring.written.store(written + 1, std::memory_order_release);
  WakeAll(ring.written);
  return absl::OkStatus();
}

int SignalBoard::DropVoid(int32_t from) {
  if (!CheckSender(from).ok()) return 0;
  Ring& ring = RingOf(from);
  uint32_t taken = ring.taken.load(std::memory_order_relaxed);  // only this owner writes it
  int dropped = 0;
  while (taken != ring.written.load(std::memory_order_acquire) &&
         ring.messages[taken % kRingDepth].sync.load(std::memory_order_relaxed) == 0) {
    ring.taken.store(++taken, std::memory_order_release);
    ++dropped;
  }
  if (dropped > 0) WakeAll(ring.taken);
  return dropped;
}

absl::StatusOr<uint8_t> SignalBoard::Take(int32_t from, SignalKey key, absl::Time deadline, absl::Duration poll_for,
                                          const std::function<bool()>& aborted) {
  SHARDSYNC_RETURN_IF_ERROR(CheckSender(from));
  Ring& ring = RingOf(from);
  const absl::Time sleep_from = absl::Now() + poll_for;
  while (true) {
    DropVoid(from);
    const uint32_t taken = ring.taken.load(std::memory_order_relaxed);  // only this owner writes it
    const uint32_t written = ring.written.load(std::memory_order_acquire);
    if (written != taken) {
      const Message& message = ring.messages[taken % kRingDepth];
      const uint64_t sync = message.sync.load(std::memory_order_relaxed);
      const int32_t round = message.round.load(std::memory_order_relaxed);
      const uint8_t value = static_cast<uint8_t>(message.value.load(std::memory_order_relaxed));
      if (sync == key.sync && round == key.round) {
        ring.taken.store(taken + 1, std::memory_order_release);
        WakeAll(ring.taken);
        return value;
      }
      if (sync == key.sync) {
        return absl::InternalError(
            absl::StrCat("rank ", from, " sent round ", round, " of this sync where round ", key.round, " was due"));
      }
      // Void since DropVoid looked (its sender moved on meanwhile): drop it next time.
      if (sync == 0) continue;
    }
    if (aborted()) return absl::AbortedError("aborted");
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(
          absl::StrCat("no message of round ", key.round, " from rank ", from, " before the deadline"));
    }
    WaitWhile(ring.written, written, deadline, sleep_from);
  }
}

absl::Status BoardTransport::Setup(const PeerSetup& setup, absl::Time deadline) {
  {
    absl::MutexLock lock(&mu_);
    peers_.clear();
    for (const auto& [peer, name] : setup.boards) {
      auto& board = opened_[name];
      if (board == nullptr) {
        absl::StatusOr<std::unique_ptr<SignalBoard>> opened = SignalBoard::Open(name);
        if (!opened.ok()) {
          opened_.erase(name);
          return absl::Status(opened.status().code(), absl::StrCat("rank ", peer, ": ", opened.status().message()));
        }
        board = *std::move(opened);
      }
      peers_[peer] = board.get();
    }
    // Boards of agents no longer named (restarted, or gone) are unmapped.
    for (auto it = opened_.begin(); it != opened_.end();) {
      const bool named = std::any_of(setup.boards.begin(), setup.boards.end(),
                                     [&](const auto& entry) { return entry.second == it->first; });
      it = named ? std::next(it) : opened_.erase(it);
    }
  }
  return others_.Setup(setup, deadline);
}

bool BoardTransport::Aborted(uint64_t sync) {
  absl::MutexLock lock(&mu_);
  return aborted_sync_ == sync;
}

absl::Status BoardTransport::RunRound(absl::string_view sync_id, int32_t round, absl::Span<const SendOp> sends,
                                      absl::Span<const RecvOp> receives, absl::Time deadline) {
  const SignalKey key{SyncKey(sync_id), round};
  const std::function<bool()> aborted = [this, &key] { return Aborted(key.sync); };
  std::vector<std::pair<SignalBoard*, const SendOp*>> board_sends;
  std::vector<const RecvOp*> board_receives;
  std::vector<SendOp> other_sends;
  std::vector<RecvOp> other_receives;
  std::vector<int32_t> board_peers;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_sync_ == key.sync) return absl::AbortedError(aborted_reason_);
    for (const auto& [peer, board] : peers_) board_peers.push_back(peer);
    for (const SendOp& send : sends) {
      const auto board = peers_.find(send.peer);
      if (board == peers_.end()) {
        other_sends.push_back(send);
      } else {
        board_sends.emplace_back(board->second, &send);
      }
    }
    for (const RecvOp& receive : receives) {
      if (peers_.count(receive.peer)) {
        board_receives.push_back(&receive);
      } else {
        other_receives.push_back(receive);
      }
    }
  }
  const auto one_byte = [](int32_t peer, int64_t bytes) {
    return bytes == 1 ? absl::OkStatus()
                      : absl::InvalidArgumentError(
                            absl::StrCat("a signal board carries one byte, not ", bytes, " (rank ", peer, ")"));
  };
  for (const auto& [board, send] : board_sends) SHARDSYNC_RETURN_IF_ERROR(one_byte(send->peer, send->bytes));
  for (const RecvOp* receive : board_receives) SHARDSYNC_RETURN_IF_ERROR(one_byte(receive->peer, receive->bytes));
  // An abort gives its reason, as the other transports do.
  const auto failed = [this](const absl::Status& status, const std::string& what) {
    absl::MutexLock lock(&mu_);
    if (absl::IsAborted(status)) return absl::AbortedError(aborted_reason_);
    return absl::Status(status.code(), absl::StrCat(what, status.message()));
  };
  // The peers' void messages leave this board's rings, now and while a peer's ring is
  // full: two agents each waiting for room on the other's board make it for each other.
  const std::function<void()> drop_void = [this, &board_peers] {
    for (int32_t peer : board_peers) own_.DropVoid(peer);
  };
  drop_void();
  for (const auto& [board, send] : board_sends) {
    const absl::Status posted = board->Post(rank_, key, *send->data, deadline, poll_for_, aborted, drop_void);
    if (!posted.ok()) return failed(posted, absl::StrCat("signalling rank ", send->peer, ": "));
  }
  if (!other_sends.empty() || !other_receives.empty()) {
    SHARDSYNC_RETURN_IF_ERROR(others_.RunRound(sync_id, round, other_sends, other_receives, deadline));
  }
  for (const RecvOp* receive : board_receives) {
    const absl::StatusOr<uint8_t> value = own_.Take(receive->peer, key, deadline, poll_for_, aborted);
    if (!value.ok()) return failed(value.status(), "");
    *receive->data = *value;
  }
  return absl::OkStatus();
}

void BoardTransport::Abort(absl::string_view sync_id, absl::string_view reason) {
  {
    absl::MutexLock lock(&mu_);
    aborted_sync_ = SyncKey(sync_id);
    aborted_reason_ = std::string(reason);
  }
  others_.Abort(sync_id, reason);
}

void BoardTransport::Reset() {
  {
    absl::MutexLock lock(&mu_);
    aborted_sync_ = 0;
    aborted_reason_.clear();
  }
  others_.Reset();
}

}  // namespace shardsync::executor
