// One-byte messages between the agents of one host through POSIX shared memory: the
// agreement before a sync writes and the direct path's completion messages, in
// microseconds rather than an RPC each. Every agent owns a board; a peer writes into
// the board's ring for the peer's rank, and the owner reads it.
//
// Board layout: a header, then one ring per sender rank (kBoardRanks of them). A ring
// holds up to kRingDepth messages in the sender's order; its sender counts the messages
// written, its reader the messages taken, and each waits on the other's counter (a
// futex shared between processes). A sender's messages of a sync it has left are void
// once it posts for a later one, so a reader drops them: a sender knows its own order
// of syncs, a reader may never have seen a sync that was aborted before it began.
// Boards are created with mode 0600: only processes of the agent's user can map them,
// the same trust as its shared memory buffers. The owner holds an flock on its board
// for its whole life, so a board nobody holds is an orphan, whatever PID namespace its
// owner ran in.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "executor/memory.h"
#include "executor/transport.h"

namespace shardsync::executor {

inline constexpr int32_t kBoardRanks = 8192;  // senders one board takes: ranks 0..kBoardRanks-1
inline constexpr uint32_t kRingDepth = 8;     // messages one sender may have waiting

// What a message belongs to. A sync's key is a stable 64-bit hash of its id, never 0
// (the mark of a void message).
struct SignalKey {
  uint64_t sync = 0;
  int32_t round = 0;
};
uint64_t SyncKey(absl::string_view sync_id);

class SignalBoard {
 public:
  // The board's name for an agent incarnation (unique on the host).
  static std::string NameFor(absl::string_view incarnation);
  // Unlinks the boards of agents that are gone (killed before they could remove their
  // own): those whose owner's lock is released. Returns how many.
  static int RemoveOrphans();
  // This agent's board, created under `name` (a POSIX shared memory name, "/..."); it is
  // unlinked when the board is destroyed.
  static absl::StatusOr<std::unique_ptr<SignalBoard>> Create(const std::string& name);
  // A peer's board, mapped to write into it.
  static absl::StatusOr<std::unique_ptr<SignalBoard>> Open(const std::string& name);
  ~SignalBoard();
  SignalBoard(const SignalBoard&) = delete;
  SignalBoard& operator=(const SignalBoard&) = delete;

  const std::string& name() const { return name_; }
  // The board's memory (this agent's own board), so that no client registers it.
  absl::StatusOr<MemorySpan> span() const;

  // Appends a message to the ring of sender `from`, first voiding the ring's untaken
  // messages of other syncs. Waits while the ring is full, running `meanwhile` between
  // waits; fails with UNAVAILABLE at `deadline` and ABORTED once `aborted` returns true
  // (checked every millisecond). A wait polls the ring for its first `poll_for`
  // (common/polling.h), then sleeps on a futex.
  absl::Status Post(int32_t from, SignalKey key, uint8_t value, absl::Time deadline, absl::Duration poll_for,
                    const std::function<bool()>& aborted, const std::function<void()>& meanwhile);
  // On this agent's own board: drops the void messages at the head of `from`'s ring,
  // making room for its sender. Returns how many.
  int DropVoid(int32_t from);
  // Takes the next message of `from` for `key` and returns its value, dropping void
  // messages before it. A message of another sync stays (the sender has moved on; its
  // sync is next here), and this waits for the deadline or the abort as above. A
  // message of this sync for another round is a protocol error (INTERNAL).
  absl::StatusOr<uint8_t> Take(int32_t from, SignalKey key, absl::Time deadline, absl::Duration poll_for,
                               const std::function<bool()>& aborted);

  struct Ring;  // in the .cc: the shared layout

 private:
  SignalBoard(std::string name, void* base, int watch, int owner_fd)
      : name_(std::move(name)), base_(base), watch_(watch), owner_fd_(owner_fd) {}
  static absl::Status CheckSender(int32_t from);  // a rank with a ring on the board
  Ring& RingOf(int32_t from) const;

  std::string name_;
  void* base_;
  int watch_;     // SigbusGuard's: a board shrunk by another process detaches, never kills
  int owner_fd_;  // the owner's descriptor, which holds the lock; -1 on a peer's board
};

// A host transport of one-byte messages: over the signal boards of the peers that have
// one (the agents of this host; PeerSetup::boards), over `others` for the rest. Rounds
// carry one byte per peer, as the agreement and the direct path's completion messages do.
// Its waits on the boards poll for `poll_for` before they sleep: an agent whose copies
// run on a GPU has its cores to spare, one that copies on the host has not.
class BoardTransport final : public Transport {
 public:
  BoardTransport(int32_t rank, SignalBoard& own, Transport& others, absl::Duration poll_for)
      : rank_(rank), own_(own), others_(others), poll_for_(poll_for) {}

  absl::string_view name() const override { return "signal-board"; }
  bool device_memory() const override { return false; }
  // Maps the boards of PeerSetup::boards (kept by name) and sets up `others`.
  absl::Status Setup(const PeerSetup& setup, absl::Time deadline) override;
  absl::Status RunRound(absl::string_view sync_id, int32_t round, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> receives, absl::Time deadline) override;
  void Abort(absl::string_view sync_id, absl::string_view reason) override;
  void Reset() override;

 private:
  bool Aborted(uint64_t sync);

  const int32_t rank_;
  SignalBoard& own_;
  Transport& others_;
  const absl::Duration poll_for_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<SignalBoard>> opened_ ABSL_GUARDED_BY(mu_);  // by name
  std::map<int32_t, SignalBoard*> peers_ ABSL_GUARDED_BY(mu_);                       // by rank
  uint64_t aborted_sync_ ABSL_GUARDED_BY(mu_) = 0;
  std::string aborted_reason_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardsync::executor
