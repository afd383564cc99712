// Runs one rank's part of a schedule, whatever the device and transport, stage after
// stage (a fence between them: the relay stage reads targets the first one wrote). In
// each stage: local copies (and the fills, in the first; beside the rounds on a
// device), then every round — receives posted before
// sends, chunks packed into and unpacked from double-buffered staging (per peer, two
// slots for each direction, all four within the peer's budget, so a device overlaps a
// round's packs and unpacks with the transfers beside it), chunks whose parts lie back
// to back on their side moved without staging. Streams with a direct peer take no
// part in the rounds: the sender copies them into the peer's mapped targets itself
// (Device::CopyDirect) and, at the end of each stage, tells the receiver they are done.
// At the end of each stage a rank quantizes the block-quantized targets whose bfloat16
// bytes that stage brought into its scratch (planner/quantize.h).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "executor/delta_snapshots.h"
#include "executor/device.h"
#include "executor/transport.h"
#include "planner/plan.h"
#include "planner/schedule.h"

namespace shardsync::executor {

struct ExecutionStats {
  int32_t rounds = 0;
  int64_t chunks = 0;
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
  int64_t local_bytes = 0;
  int64_t fill_bytes = 0;
  int64_t peak_staging_bytes = 0;       // staging in use at once (two rounds), all peers
  int64_t peak_peer_staging_bytes = 0;  // staging of one peer, both directions and slots (<= budget)
  int64_t direct_sent_bytes = 0;        // of sent_bytes, written into peers' targets directly
  int64_t staged_sent_bytes = 0;        // of sent_bytes, the rest: chunks through the transport
  int64_t direct_received_bytes = 0;    // of received_bytes, written here by peers directly
  int64_t quantized_bytes = 0;          // float8 targets quantized from scratch (a byte per element)
  double seconds = 0;
  double local_seconds = 0;        // the local copies and fills alone (beside the rounds on a device)
  double direct_wait_seconds = 0;  // waiting for this rank's direct copies and the peers' completion
  // Delta sync (RunInputs::delta), of the chunks this rank sent through the transport:
  int64_t wire_bytes = 0;       // what went to the transport, deltas encoded (sent_bytes counts them whole)
  int64_t delta_chunks = 0;     // sent as deltas
  int64_t changed_words = 0;    // 16-bit words that differed from their snapshots, in those
  double encode_seconds = 0;    // diffing and keeping snapshots
  double baseline_seconds = 0;  // gathering the receives' baselines from the targets
  double apply_seconds = 0;     // applying the deltas received onto them
  // The chunks sent whole, by why: a reason of DeltaRun::full_peers, "new_target" (the
  // peer's targets hold no version), one of SnapshotLookup's, or "no_gain" (the
  // encoding was not smaller).
  std::map<std::string, int64_t> full_chunks;
  struct PeerWire {
    int64_t wire_bytes = 0;
    int64_t changed_words = 0;
  };
  std::map<int32_t, PeerWire> peer_wire;  // the same per receiving peer
};

// How far a run is, readable from another thread while it goes.
struct ExecutionProgress {
  std::atomic<int64_t> bytes_done{0};
  std::atomic<int64_t> bytes_total{0};
  std::atomic<int32_t> rounds_done{0};
  std::atomic<int32_t> rounds_total{0};
};

// The direct path of one run: the peers whose streams bypass the transport, and the
// host transport that carries each stage's completion messages between them (round
// DirectDoneRound(stage), one byte from every direct sender to its receiver, sent once
// the sender's direct copies of that stage are complete).
struct DirectLinks {
  std::vector<int32_t> peers;    // ascending
  Transport* signals = nullptr;  // set when `peers` is not empty
  bool Has(int32_t peer) const { return std::binary_search(peers.begin(), peers.end(), peer); }
};

// The word of DeltaRun::full_peers (the coordinator's DeltaSpec.full_peers) for a link
// inside a node under --delta auto.
inline constexpr char kSameNodeWord[] = "same_node";

// Delta sync of one run (host transports, plans without block-quantized targets). Every
// chunk this rank sends through the transport is kept as its snapshot for the next
// sync; a chunk to a peer whose targets hold `peer_versions[peer]` goes as a delta
// against the snapshot of that version, where one is kept and the delta is smaller.
// `senders`: the peers that may send deltas here (this rank's targets hold the version
// they were told), so each receive from them gathers its baseline from them first. A
// peer in `full_peers` for kSameNodeWord never gets deltas: nothing is kept for it.
struct DeltaRun {
  std::string digest;                            // of the plan: snapshots are per plan
  std::map<int32_t, std::string> peer_versions;  // by receiving peer
  std::map<int32_t, std::string> full_peers;     // peers every chunk goes whole to, with why (a word)
  std::set<int32_t> senders;
  DeltaSnapshots* snapshots = nullptr;
};

// One run's inputs: this rank's part of `schedule` of `plan`, over `buffers` (by the
// plan's local buffer ids), staging of `staging_bytes` per peer, until `deadline`.
struct RunInputs {
  absl::string_view sync_id;
  const planner::Plan& plan;
  const planner::Schedule& schedule;
  const BufferTable& buffers;
  int64_t staging_bytes = 0;
  absl::Time deadline;
  ExecutionProgress* progress = nullptr;  // updated as the run goes, if given
  DirectLinks direct;
  const DeltaRun* delta = nullptr;  // delta sync, if on
};

class RoundEngine {
 public:
  RoundEngine(Device& device, Transport& transport) : device_(device), transport_(transport) {}

  // Contract: every buffer the schedule touches on this rank is in `buffers` and was
  // checked (bounds, roles) at Prepare; so is every buffer of a `direct` peer that it
  // writes (mapped here). Sources are only read. A direct receive completes when its
  // sender says so: the run waits for that as for a round (deadline, abort).
  absl::StatusOr<ExecutionStats> Run(const RunInputs& run);

 private:
  struct Tally;  // a run's stats and staging accounting as it goes
  absl::StatusOr<ExecutionStats> RunStages(const RunInputs& run);
  // Stage `k`: local copies (and the fills, in the first), direct copies, every round,
  // the direct path's completion, the stage's quantizes.
  absl::Status RunStage(const RunInputs& run, size_t k, Tally& tally);
  // Round `round` of stage `stage`: receives posted before sends, through staging where
  // a chunk's parts do not lie back to back.
  absl::Status RunRound(const RunInputs& run, const planner::Stage& stage, int32_t round, Tally& tally);
  // Turns `send` (the chunk of transport round `round`) into a delta against the peer's
  // snapshot where it pays, `encoded` holding it; keeps the chunk as the next snapshot.
  static void SendAsDelta(const RunInputs& run, int32_t round, SendOp& send, std::deque<std::string>& encoded,
                          ExecutionStats& stats);

  // Before a stage's direct copies, when scratch is handed off (Schedule): each rank
  // tells the peers that write it directly that its earlier quantizes are done, and
  // waits for the same from the peers it writes.
  absl::Status HandOffScratch(absl::string_view sync_id, int32_t stage_number, const planner::Stage& stage,
                              absl::Time deadline, const DirectLinks& direct);

  Device& device_;
  Transport& transport_;
};

}  // namespace shardsync::executor
