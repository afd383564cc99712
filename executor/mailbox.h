// The receiving half of a host transport. A rank posts its receives for a round; a
// peer's delivery for that round blocks until the matching receive is posted, then
// copies straight into the posted memory. So nothing is buffered beyond what the
// receiver posted: staging stays within the budget however far ahead a sender runs.
// A chunk may come in pieces (byte ranges of it, in any order, several at once); its
// receive is done once its pieces cover it, each byte once.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "executor/transport.h"

namespace shardsync::executor {

class Mailbox {
 public:
  // Posts this round's receives (one per peer at most).
  void Post(absl::string_view sync_id, int32_t round, absl::Span<const RecvOp> receives);
  // A piece of a peer's chunk: its bytes from `offset` on, `span` of them, of a chunk of
  // `chunk_bytes`, as `bytes` at `data`: those bytes themselves, or with `delta` their
  // delta encoding (delta_codec.h), onto the receiver's copy of them.
  struct Piece {
    const uint8_t* data = nullptr;
    int64_t bytes = 0;
    int64_t offset = 0;
    int64_t span = 0;
    int64_t chunk_bytes = 0;
    bool delta = false;
  };
  // Waits until the receive of `from`'s chunk is posted, then copies the piece in or
  // applies its delta onto the receive's baseline, without the lock (several peers'
  // pieces go in at once); the receive is done once its pieces cover it. Refused
  // (INTERNAL naming the rank): a chunk of another size than the receive's, a piece
  // past its end or over bytes another piece took, a delta for a receive without a
  // baseline or that does not encode exactly its span.
  absl::Status Deliver(absl::string_view sync_id, int32_t from, int32_t round, const Piece& piece, absl::Time deadline);
  // Waits until every posted receive of the round is delivered; names the peers missing.
  // Returns only once no delivery writes the receives (also when aborted or late).
  absl::Status Wait(absl::Time deadline);
  // Fails every delivery and wait of `sync_id` (only that sync: a delivery for a later
  // one waits for its receive as usual).
  void Abort(absl::string_view sync_id, absl::string_view reason);
  // Forgets every receive once no delivery writes one.
  void Reset();

 private:
  struct Slot {
    RecvOp op;
    int32_t round = -1;
    std::map<int64_t, int64_t> taken{};  // the byte ranges deliveries took (writing, or done): begin -> end
    int64_t written = 0;                 // bytes the finished deliveries wrote
    bool delivered = false;              // one delivery finished (a chunk of 0 bytes is done then)
    bool done() const { return delivered && written == op.bytes; }
  };
  // Takes the piece's span of `from`'s receive for a delivery, or says why it cannot.
  static absl::Status Take(Slot& slot, int32_t from, const Piece& piece);
  absl::Mutex mu_;
  std::string sync_id_ ABSL_GUARDED_BY(mu_);
  std::map<int32_t, Slot> slots_ ABSL_GUARDED_BY(mu_);  // by peer
  int32_t copying_ ABSL_GUARDED_BY(mu_) = 0;            // deliveries writing a receive now
  std::string aborted_sync_ ABSL_GUARDED_BY(mu_);
  std::string aborted_ ABSL_GUARDED_BY(mu_);  // why, when aborted_sync_ is set
};

// A send's pieces, in order: its chunk cut every kPieceBytes, or its delta's pieces (a
// chunk of 0 bytes is one empty piece).
std::vector<Mailbox::Piece> PiecesOf(const SendOp& send);

// An in-process transport between ranks in one process (threads), for tests of
// everything above the wire.
class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(int32_t rank, std::map<int32_t, Mailbox*> mailboxes)
      : rank_(rank), mailboxes_(std::move(mailboxes)) {}
  absl::string_view name() const override { return "loopback"; }
  bool device_memory() const override { return false; }
  absl::Status Setup(const PeerSetup&, absl::Time) override { return absl::OkStatus(); }
  absl::Status RunRound(absl::string_view sync_id, int32_t round, absl::Span<const SendOp> sends,
                        absl::Span<const RecvOp> receives, absl::Time deadline) override;
  void Abort(absl::string_view sync_id, absl::string_view reason) override {
    mailboxes_.at(rank_)->Abort(sync_id, reason);
  }
  void Reset() override { mailboxes_.at(rank_)->Reset(); }

 private:
  int32_t rank_;
  std::map<int32_t, Mailbox*> mailboxes_;
};

}  // namespace shardsync::executor
