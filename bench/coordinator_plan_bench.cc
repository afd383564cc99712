// The coordinator's work before the first sync of a layout epoch, for the planner
// benchmark's MoE (planner/moe_layout.h): the streamed plan with each rank's segments written
// to the plan's file (CompileEpoch), then one PrepareRequest per rank made from its
// segments alone (ScheduleRequest), rank after rank as a Prepare fan-out limited to one
// at a time would. Times both, the file's and the requests' size, and the peak RSS;
// then the agent's first step with the largest request: its wire bytes parsed and
// decoded into the rank's plan and schedule (DecodeSchedule, every index checked).
// Last, what a sync's response costs with every link in it (SyncRequest.links).
//   bazel run -c opt //bench:coordinator_plan_bench -- [--moe-layers N] [--dense] [--plan-dir D]
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "daemon/common/plan_report.h"
#include "daemon/common/schedule_codec.h"
#include "daemon/coordinator/epoch_plan.h"
#include "planner/moe_layout.h"

namespace shardsync::bench {
namespace {

int Run(int layers, bool dense, int64_t staging_bytes, const std::string& plan_dir) {
  planner::MoeShape shape;
  shape.layers = layers;
  shape.dense = dense;
  const planner::PlanInput input = planner::MoeLayout(shape);
  std::vector<std::string> buffer_names;  // the coordinator names buffers by id
  for (const planner::Buffer& b : input.buffers) {
    if (b.holder.buffer >= static_cast<int32_t>(buffer_names.size())) buffer_names.resize(b.holder.buffer + 1);
  }
  for (size_t id = 0; id < buffer_names.size(); ++id) buffer_names[id] = absl::StrCat("buffer-", id);

  coordinator::EpochOptions options;
  options.world_size = planner::NumRanks(input);
  options.staging_bytes = staging_bytes;
  options.relay = planner::RelayMode::kNever;  // one node: nothing to relay
  if (!plan_dir.empty()) options.plan_dir = plan_dir;
  rusage before{};
  getrusage(RUSAGE_SELF, &before);  // the layouts alone, as the agents published them
  const absl::Time planning = absl::Now();
  const absl::StatusOr<coordinator::EpochPlan> epoch = coordinator::CompileEpoch(input, buffer_names, options);
  const double plan_ms = absl::ToDoubleMilliseconds(absl::Now() - planning);
  if (!epoch.ok()) return std::fprintf(stderr, "%s\n", std::string(epoch.status().message()).c_str()), 1;
  const absl::Time start = absl::Now();
  int64_t bytes = 0, max_bytes = 0, records = 0;
  int32_t max_rank = 0;
  for (int32_t rank = 0; rank < options.world_size; ++rank) {
    const absl::StatusOr<v1::PrepareRequest> request = coordinator::ScheduleRequest(*epoch, rank);
    if (!request.ok()) return std::fprintf(stderr, "%s\n", std::string(request.status().message()).c_str()), 1;
    const int64_t n = static_cast<int64_t>(request->ByteSizeLong());
    bytes += n;
    if (n > max_bytes) max_bytes = n, max_rank = rank;
    records += request->segment_count();
  }
  const double requests_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);  // the coordinator's peak, before the agent's step
  // The largest request as its agent gets it: wire bytes, parsed, then decoded.
  std::string wire;
  {
    const absl::StatusOr<v1::PrepareRequest> request = coordinator::ScheduleRequest(*epoch, max_rank);
    if (!request.ok() || !request->SerializeToString(&wire)) return std::fprintf(stderr, "serializing failed\n"), 1;
  }
  const absl::Time decoding = absl::Now();
  v1::PrepareRequest received;
  if (!received.ParseFromString(wire)) return std::fprintf(stderr, "parsing rank %d's request failed\n", max_rank), 1;
  const absl::StatusOr<daemon::LocalSchedule> decoded = daemon::DecodeSchedule(received, max_rank);
  if (!decoded.ok()) return std::fprintf(stderr, "%s\n", std::string(decoded.status().message()).c_str()), 1;
  const double decode_ms = absl::ToDoubleMilliseconds(absl::Now() - decoding);
  // What SyncRequest.links adds to a sync's response: every link, built and serialized.
  const absl::Time linking = absl::Now();
  v1::SyncResponse linked;
  for (v1::LinkBytes& link : daemon::LinksOf(epoch->planned.stats)) *linked.add_links() = std::move(link);
  const std::string linked_wire = linked.SerializeAsString();
  const double links_ms = absl::ToDoubleMilliseconds(absl::Now() - linking);
  std::printf(
      "{\"case\":\"moe %d layers%s\",\"ranks\":%d,\"segments\":%lld,\"segment_records\":%lld,"
      "\"plan_ms\":%.1f,\"plan_file_bytes\":%lld,\"requests_ms\":%.1f,\"encoded_bytes\":%lld,"
      "\"max_rank_encoded_bytes\":%lld,\"max_rank_decode_ms\":%.1f,\"links\":%d,\"links_bytes\":%zu,"
      "\"links_ms\":%.1f,\"digest\":\"%s\",\"layouts_rss_mib\":%ld,\"peak_rss_mib\":%ld}\n",
      layers, dense ? " with dense tensors" : ", experts", epoch->planned.plan.num_ranks,
      static_cast<long long>(epoch->planned.stats.segments), static_cast<long long>(records), plan_ms,
      static_cast<long long>(epoch->segments->file_bytes()), requests_ms, static_cast<long long>(bytes),
      static_cast<long long>(max_bytes), decode_ms, linked.links_size(), linked_wire.size(), links_ms,
      epoch->digest().c_str(), before.ru_maxrss / 1024, usage.ru_maxrss / 1024);
  return 0;
}

}  // namespace
}  // namespace shardsync::bench

int main(int argc, char** argv) {
  int layers = 61;
  bool dense = false;
  int64_t staging_bytes = int64_t{128} << 20;
  std::string plan_dir;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--moe-layers" && i + 1 < argc) {
      layers = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--dense") {
      dense = true;
    } else if (arg == "--plan-dir" && i + 1 < argc) {
      plan_dir = argv[++i];
    } else if (arg == "--staging-bytes" && i + 1 < argc) {
      staging_bytes = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: coordinator_plan_bench [--moe-layers N] [--dense] [--staging-bytes B] [--plan-dir D]\n"
                   "  --moe-layers N      MoE layers (61)\n"
                   "  --dense             the dense tensors too (ZeRO-3 over all ranks; ~10 M segments a layer)\n"
                   "  --staging-bytes B   staging budget per peer (134217728)\n"
                   "  --plan-dir D        the plan's file (the coordinator's default: $TMPDIR, else /var/tmp)\n");
      return 2;
    }
  }
  return shardsync::bench::Run(layers, dense, staging_bytes, plan_dir);
}
