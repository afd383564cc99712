#include "daemon/common/rank_stats.h"

namespace shardsync::daemon {

v1::RankStats RankStatsOf(int32_t rank, const planner::RankStats& planned) {
  v1::RankStats out;
  out.set_rank(rank);
  out.set_rounds(planned.rounds);
  out.set_chunks(planned.chunks);
  out.set_sent_bytes(planned.sent_bytes);
  out.set_received_bytes(planned.received_bytes);
  out.set_local_bytes(planned.local_bytes);
  out.set_fill_bytes(planned.fill_bytes);
  out.set_network_sent_bytes(planned.network_sent_bytes);
  out.set_network_received_bytes(planned.network_received_bytes);
  out.set_relayed_bytes(planned.relayed_bytes);
  out.set_quantized_bytes(planned.quantized_bytes);
  return out;
}

v1::RankStats RankStatsOf(int32_t rank, const executor::ExecutionStats& measured, int64_t scratch_bytes,
                          const ExecuteTimes& times) {
  v1::RankStats out;
  out.set_rank(rank);
  out.set_rounds(measured.rounds);
  out.set_chunks(measured.chunks);
  out.set_sent_bytes(measured.sent_bytes);
  out.set_received_bytes(measured.received_bytes);
  out.set_local_bytes(measured.local_bytes);
  out.set_fill_bytes(measured.fill_bytes);
  out.set_peak_staging_bytes(measured.peak_staging_bytes);
  out.set_peak_peer_staging_bytes(measured.peak_peer_staging_bytes);
  out.set_direct_sent_bytes(measured.direct_sent_bytes);
  out.set_staged_sent_bytes(measured.staged_sent_bytes);
  out.set_direct_received_bytes(measured.direct_received_bytes);
  out.set_quantized_bytes(measured.quantized_bytes);
  out.set_scratch_bytes(scratch_bytes);
  out.set_wire_bytes(measured.wire_bytes);
  out.set_delta_chunks(measured.delta_chunks);
  out.set_changed_words(measured.changed_words);
  out.set_encode_seconds(measured.encode_seconds);
  out.set_baseline_seconds(measured.baseline_seconds);
  out.set_apply_seconds(measured.apply_seconds);
  out.mutable_full_chunks()->insert(measured.full_chunks.begin(), measured.full_chunks.end());
  for (const auto& [peer, wire] : measured.peer_wire) {
    v1::PeerWire* link = out.add_peer_wire();
    link->set_peer(peer);
    link->set_wire_bytes(wire.wire_bytes);
    link->set_changed_words(wire.changed_words);
  }
  out.set_seconds(measured.seconds);
  out.set_local_seconds(measured.local_seconds);
  out.set_direct_wait_seconds(measured.direct_wait_seconds);
  out.set_execute_seconds(absl::ToDoubleSeconds(times.finished - times.entered));
  out.set_check_seconds(absl::ToDoubleSeconds(times.checked - times.entered));
  out.set_agree_seconds(absl::ToDoubleSeconds(times.agreed - times.checked));
  return out;
}

}  // namespace shardsync::daemon
