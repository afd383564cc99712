// Transports move one round's chunks between agents. Implementations: the host
// transport over the agents' own gRPC channels (daemon/agent), NCCL on GPUs, and an
// in-process loopback for tests. Chosen by configuration, queried for capabilities.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace shardsync::executor {

// A host transport sends a chunk in pieces of up to this many of its bytes, a message
// each, so that copying, the link and the peer's copying overlap; a delta encodes each
// piece on its own.
inline constexpr int64_t kPieceBytes = int64_t{1} << 20;

struct SendOp {
  int32_t peer = 0;
  const uint8_t* data = nullptr;
  int64_t bytes = 0;
  // Delta sync: `data` is a delta encoding (delta_codec.h) of a chunk of `chunk_bytes`,
  // piece by piece: piece i, the chunk's bytes from i * kPieceBytes on (kPieceBytes of
  // them, the last fewer), is encoded on its own and ends at `delta_ends[i]` in `data`.
  // Empty: `data` is the chunk itself.
  std::vector<int64_t> delta_ends{};
  int64_t chunk_bytes = 0;  // with delta_ends
};

struct RecvOp {
  int32_t peer = 0;
  uint8_t* data = nullptr;
  int64_t bytes = 0;
  bool baseline = false;                        // `data` holds the chunk as the receiver has it: a delta may come
  std::atomic<int64_t>* apply_nanos = nullptr;  // where applying a delta adds its time, if set
};

// What a transport needs to reach its peers in a sync.
struct PeerSetup {
  int32_t rank = 0;
  int32_t world_size = 0;
  std::map<int32_t, std::string> addresses;  // host transport: peers' AgentControl addresses
  std::map<int32_t, std::string> boards;     // signal boards of the peers on this host
  std::string communicator_id;               // NCCL: the unique id of `generation`
  int64_t generation = 0;                    // NCCL: a new value means a new communicator
};

// The round number of Agree's exchange on a host transport (rounds count from 0).
inline constexpr int32_t kAgreementRound = -1;
// The round number of the direct path's completion messages of a stage (RoundEngine).
inline constexpr int32_t DirectDoneRound(int32_t stage) { return -2 - stage; }
// The round number of the messages that say a rank's scratch is free for a stage's
// direct writes (RoundEngine), below every DirectDoneRound.
inline constexpr int32_t ScratchFreeRound(int32_t stage) { return -1000 - stage; }

class Transport {
 public:
  virtual ~Transport() = default;
  virtual absl::string_view name() const = 0;
  // Capability: sends from and receives into device memory.
  virtual bool device_memory() const = 0;
  // Makes the peers reachable before a sync's rounds. For NCCL a new generation builds
  // a new communicator: a collective call, every rank makes it with the same id.
  virtual absl::Status Setup(const PeerSetup& setup, absl::Time deadline) = 0;
  // NCCL, on the rank that roots the bootstrap: a fresh communicator id. Transports
  // that need none return an empty string.
  virtual absl::StatusOr<std::string> NewCommunicatorId() { return std::string(); }
  // One round with many peers: every receive is posted before any send. A host
  // transport returns when the round is complete; a device transport may return once
  // the round is queued on the device's stream, in order with the copies around it.
  // A peer that does not complete by `deadline` fails with UNAVAILABLE naming it; after
  // Abort every wait returns ABORTED.
  virtual absl::Status RunRound(absl::string_view sync_id, int32_t round, absl::Span<const SendOp> sends,
                                absl::Span<const RecvOp> receives, absl::Time deadline) = 0;
  // Before a sync writes anything: tells every rank of `peers.world_size` whether this
  // one is ready, and answers whether all are. Every rank calls it once per sync, after
  // Setup, with the same deadline and abort rules as a round. The default (host
  // transports) exchanges a byte with every other rank in a round of its own,
  // kAgreementRound; NCCL reduces one integer on the device.
  virtual absl::StatusOr<bool> Agree(absl::string_view sync_id, const PeerSetup& peers, bool ready,
                                     absl::Time deadline);
  // Capability: Agree costs one collective on the device (tens of microseconds), not
  // a round of messages between every pair of ranks. Agents with it agree in every
  // sync, and the coordinator skips Prepare for them once they hold the schedule.
  virtual bool fast_agreement() const { return false; }
  // Waits for every round queued so far, with the same deadline and abort rules.
  virtual absl::Status Finish(absl::Time) { return absl::OkStatus(); }
  // Stops sync `sync_id` wherever it waits; later syncs are not affected.
  virtual void Abort(absl::string_view sync_id, absl::string_view reason) = 0;
  // Clears an abort before the next sync.
  virtual void Reset() = 0;
};

}  // namespace shardsync::executor
