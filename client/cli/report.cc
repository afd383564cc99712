#include "client/cli/report.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "client/cli/format.h"
#include "google/protobuf/util/json_util.h"

namespace shardsync::cli {

void PrintJson(const google::protobuf::Message& message, std::ostream& out) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  google::protobuf::util::MessageToJsonString(message, &json, options);
  out << json << "\n";
}

namespace {

// A NIC per rank: the busiest rank's network bytes in and out against an even share,
// in over every rank that receives (each could take its node's share), out over the
// ranks that send to other nodes.
void PrintNics(const v1::ExplainResponse& report, std::ostream& out) {
  int64_t into = 0, out_of = 0, busiest_in = 0, busiest_out = 0;
  int receivers = 0, senders = 0;
  for (const v1::RankStats& r : report.ranks()) {
    if (r.received_bytes() > 0) {
      ++receivers;
      into += r.network_received_bytes();
      busiest_in = std::max(busiest_in, r.network_received_bytes());
    }
    if (r.network_sent_bytes() > 0) {
      ++senders;
      out_of += r.network_sent_bytes();
      busiest_out = std::max(busiest_out, r.network_sent_bytes());
    }
  }
  if (receivers == 0 || senders == 0 || into == 0) return;
  const double even_in = static_cast<double>(into) / receivers;
  const double even_out = static_cast<double>(out_of) / senders;
  out << absl::StrFormat(
      "NICs (one a rank): into the busiest %s, %.3fx an even share over the %d ranks that receive (%.3f ms at %g "
      "GB/s); out of the busiest %s, %.3fx an even share over the %d that send\n",
      Bytes(busiest_in), busiest_in / even_in, receivers, even_in / (report.network_gbps() * 1e9) * 1e3,
      report.network_gbps(), Bytes(busiest_out), busiest_out / even_out, senders);
}

}  // namespace

void PrintPlanReport(const v1::ExplainResponse& report, absl::string_view title, bool links, std::ostream& out) {
  out << absl::StrFormat("%s, digest %s: %d tensors on %d ranks, %d segments, %d chunks, %d rounds\n", title,
                         report.digest(), report.tensors(), report.ranks_size(), report.segments(), report.chunks(),
                         report.rounds());
  int64_t sent = 0, local = 0;
  for (const v1::RankStats& r : report.ranks()) sent += r.sent_bytes(), local += r.local_bytes();
  out << absl::StrFormat("moves %s (%s over links, %s local)\n", Bytes(sent + local), Bytes(sent), Bytes(local));
  int64_t direct = 0, staged = 0;  // zero both where the paths are not known
  for (const v1::RankStats& r : report.ranks()) direct += r.direct_sent_bytes(), staged += r.staged_sent_bytes();
  if (direct + staged > 0) {
    out << absl::StrFormat("paths: %s direct (written in place, no staging), %s staged through the transport\n",
                           Bytes(direct), Bytes(staged));
  }
  const bool nodes = report.unrelayed_floor_seconds() > 0 || report.network_bytes() > 0;
  if (nodes) {
    out << absl::StrFormat(
        "between nodes %s; %s (%s forwarded from targets)%s\n", Bytes(report.network_bytes()),
        report.relayed_bytes() > 0 ? "relayed" : "not relayed", Bytes(report.relayed_bytes()),
        report.unrelayed_floor_seconds() > 0
            ? absl::StrFormat("; the cost model's floor %.3f ms unrelayed, %.3f ms relayed",
                              report.unrelayed_floor_seconds() * 1e3, report.relayed_floor_seconds() * 1e3)
            : "");
  }
  int64_t quantized = 0, scratch = 0;
  for (const v1::RankStats& r : report.ranks())
    quantized += r.quantized_bytes(), scratch = std::max(scratch, r.scratch_bytes());
  if (quantized > 0) {
    out << absl::StrFormat(
        "float8 targets: %d elements quantized from bfloat16 scratch (at most %s per rank), %d "
        "stages; the floor counts the quantize pass (3 bytes per element)\n",
        quantized, Bytes(scratch), report.stages());
  }
  out << absl::StrFormat("floor %.3f ms at %g GB/s per link direction, %g GB/s memory (read + write)%s\n",
                         report.floor_seconds() * 1e3, report.link_gbps(), report.memory_gbps(),
                         nodes ? absl::StrFormat(", %g GB/s network", report.network_gbps()) : "");
  if (nodes) PrintNics(report, out);
  // Imbalance: the busiest rank's link bytes over the mean; 1.00 is perfectly even.
  int64_t busiest = 0, sum = 0, busiest_rank = 0;
  for (const v1::RankStats& r : report.ranks()) {
    const int64_t bytes = std::max(r.sent_bytes(), r.received_bytes());
    sum += bytes;
    if (bytes > busiest) busiest = bytes, busiest_rank = r.rank();
  }
  const double mean = report.ranks_size() > 0 ? static_cast<double>(sum) / report.ranks_size() : 0;
  out << absl::StrFormat("imbalance %.2f (the busiest link is rank %d's: %s)\n\n", mean > 0 ? busiest / mean : 1.0,
                         busiest_rank, Bytes(busiest));
  out << absl::StrFormat("%-6s %12s %12s %12s %10s %7s %7s%s\n", "rank", "sent", "received", "local", "fill", "chunks",
                         "rounds",
                         nodes ? absl::StrFormat(" %12s %12s %12s", "net sent", "net received", "relayed") : "");
  for (const v1::RankStats& r : report.ranks()) {
    out << absl::StrFormat("%-6d %12s %12s %12s %10s %7d %7d%s\n", r.rank(), Bytes(r.sent_bytes()),
                           Bytes(r.received_bytes()), Bytes(r.local_bytes()), Bytes(r.fill_bytes()), r.chunks(),
                           r.rounds(),
                           nodes ? absl::StrFormat(" %12s %12s %12s", Bytes(r.network_sent_bytes()),
                                                   Bytes(r.network_received_bytes()), Bytes(r.relayed_bytes()))
                                 : "");
  }
  if (links) {
    out << "\nlinks (from -> to: bytes, path)\n";
    for (const v1::LinkBytes& l : report.links()) {
      const char* path = l.path() == v1::DIRECT ? ", direct, no staging" : l.path() == v1::STAGED ? ", staged" : "";
      out << absl::StrFormat("  %d -> %d: %s%s\n", l.from_rank(), l.to_rank(), Bytes(l.bytes()), path);
    }
  }
}

}  // namespace shardsync::cli
