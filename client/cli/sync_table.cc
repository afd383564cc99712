#include "client/cli/sync_table.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/format.h"

namespace shardsync::cli {

void PrintSyncTable(const v1::SyncResponse& response, std::ostream& out) {
  out << absl::StrFormat("sync %s: epoch %d, digest %s, %.3f s (planning %.3f s; %s)\n", response.sync_id(),
                         response.layout_epoch(), response.digest(), response.seconds(), response.plan_seconds(),
                         response.one_call() ? "one call per agent" : "Prepare, then Execute");
  if (response.relayed_bytes() > 0 || response.network_bytes() > 0) {
    out << absl::StrFormat(
        "%s between nodes%s\n", Bytes(response.network_bytes()),
        response.relayed_bytes() > 0 ? ", relayed (a second stage copied targets within each node)" : "");
  }
  int64_t scratch = 0;
  for (const v1::RankStats& r : response.ranks()) scratch = std::max(scratch, r.scratch_bytes());
  if (response.quantized_bytes() > 0) {
    out << absl::StrFormat(
        "float8 targets: %d elements quantized from bfloat16 scratch (at most %s per agent), %d "
        "stages\n",
        response.quantized_bytes(), Bytes(scratch), response.stages());
  }
  int64_t direct = 0, staged = 0;
  for (const v1::RankStats& r : response.ranks()) direct += r.direct_sent_bytes(), staged += r.staged_sent_bytes();
  if (direct + staged > 0) {
    out << absl::StrFormat("between agents: %s direct (written in place, no staging), %s staged\n", Bytes(direct),
                           Bytes(staged));
  }
  int64_t wire = 0, whole = 0, deltas = 0, changed = 0;
  double encode = 0, apply = 0;
  std::map<std::string, int64_t> sent_whole;  // chunks of delta links sent whole, by why
  for (const v1::RankStats& r : response.ranks()) {
    wire += r.wire_bytes();
    whole += r.staged_sent_bytes();
    deltas += r.delta_chunks();
    changed += r.changed_words();
    encode = std::max(encode, r.encode_seconds());
    apply = std::max(apply, r.apply_seconds());
    for (const auto& [why, chunks] : r.full_chunks()) sent_whole[why] += chunks;
  }
  if (deltas > 0 || !sent_whole.empty()) {
    out << absl::StrFormat(
        "delta sync: %s on the wire for %s of staged chunks (%.2f%%), %d chunks as deltas, %d "
        "16-bit words changed in them; encode %.3f s, apply %.3f s (slowest rank)\n",
        Bytes(wire), Bytes(whole), whole > 0 ? 100.0 * wire / whole : 0.0, deltas, changed, encode, apply);
  }
  if (!sent_whole.empty()) {
    out << "delta sync, chunks sent whole: "
        << absl::StrJoin(sent_whole, ", ",
                         [](std::string* line, const std::pair<const std::string, int64_t>& entry) {
                           absl::StrAppend(line, entry.second, " ", entry.first);
                         })
        << "\n";
  }
  const int written = response.target_ranks_size();
  out << (written <= 16 ? absl::StrCat("targets written on rank ", absl::StrJoin(response.target_ranks(), ", rank "))
                        : absl::StrCat("targets written on ", written, " ranks"))
      << "\n\n";
  out << absl::StrFormat("%-6s %12s %12s %12s %7s %7s %13s %10s %9s\n", "rank", "sent", "received", "local", "rounds",
                         "chunks", "peak staging", "seconds", "GB/s");
  int64_t sent = 0, received = 0, local = 0;
  for (const v1::RankStats& r : response.ranks()) {
    const double moved = static_cast<double>(r.received_bytes() + r.local_bytes());
    out << absl::StrFormat("%-6d %12s %12s %12s %7d %7d %13s %10.4f %9.2f\n", r.rank(), Bytes(r.sent_bytes()),
                           Bytes(r.received_bytes()), Bytes(r.local_bytes()), r.rounds(), r.chunks(),
                           Bytes(r.peak_staging_bytes()), r.seconds(), r.seconds() > 0 ? moved / r.seconds() / 1e9 : 0);
    sent += r.sent_bytes();
    received += r.received_bytes();
    local += r.local_bytes();
  }
  out << absl::StrFormat("%-6s %12s %12s %12s   effective %.2f GB/s over the whole sync\n", "total", Bytes(sent),
                         Bytes(received), Bytes(local),
                         response.seconds() > 0 ? (received + local) / response.seconds() / 1e9 : 0);
  if (response.verified_placements() > 0) {
    double slowest = 0;
    for (const v1::RankStats& r : response.ranks()) slowest = std::max(slowest, r.verify_seconds());
    out << absl::StrFormat("verified: %d placements (tensor, target rank) equal their sources; checksums took %.4f s\n",
                           response.verified_placements(), slowest);
  }
  if (response.unverified_quantized_placements() > 0) {
    out << absl::StrFormat("not verified: %d float8 placements (their bytes are not their sources')\n",
                           response.unverified_quantized_placements());
  }
  if (response.links_size() > 0) {
    out << "\nlinks (from -> to: bytes, path)\n";
    for (const v1::LinkBytes& l : response.links()) {
      out << absl::StrFormat(
          "  %d -> %d: %s, %s%s\n", l.from_rank(), l.to_rank(), Bytes(l.bytes()),
          l.path() == v1::DIRECT ? "direct" : "staged",
          l.wire_bytes() > 0 ? absl::StrCat(", ", Bytes(l.wire_bytes()), " on the wire (delta)") : "");
    }
  }
}

}  // namespace shardsync::cli
