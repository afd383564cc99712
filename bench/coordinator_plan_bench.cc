// The coordinator's work before the first sync of a layout epoch, for the planner
// benchmark's MoE (bench/moe.h): the plan, every rank's schedule, the digest, and one
// PrepareRequest per rank, by the coordinator's own CompileEpoch. planner_bench times
// the first two (the planning target); this times all four, and the requests' size.
//   bazel run -c opt //bench:coordinator_plan_bench -- [--moe-layers N] [--dense]
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/moe.h"
#include "daemon/common/schedule_codec.h"
#include "daemon/coordinator/epoch_plan.h"

namespace shardsync::bench {
namespace {

int Run(int layers, bool dense, int64_t staging_bytes) {
  MoeShape shape;
  shape.layers = layers;
  shape.dense = dense;
  const planner::PlanInput input = MoeLayout(shape);
  std::vector<std::string> buffer_names;  // the coordinator names buffers by id
  for (const planner::Buffer& b : input.buffers) {
    if (b.holder.buffer >= static_cast<int32_t>(buffer_names.size())) buffer_names.resize(b.holder.buffer + 1);
  }
  for (size_t id = 0; id < buffer_names.size(); ++id) buffer_names[id] = absl::StrCat("buffer-", id);

  coordinator::EpochOptions options;
  for (const planner::Buffer& b : input.buffers) options.world_size = std::max(options.world_size, b.holder.rank + 1);
  options.staging_bytes = staging_bytes;
  options.relay = planner::RelayMode::kNever;  // one node: nothing to relay
  const absl::StatusOr<coordinator::EpochPlan> epoch = coordinator::CompileEpoch(input, buffer_names, options);
  if (!epoch.ok()) return std::fprintf(stderr, "%s\n", std::string(epoch.status().message()).c_str()), 1;
  const std::vector<const v1::PrepareRequest*>& requests = epoch->requests;
  int64_t bytes = 0, max_bytes = 0, specs = 0;
  for (const v1::PrepareRequest* r : requests) {
    const int64_t n = static_cast<int64_t>(r->ByteSizeLong());
    bytes += n;
    max_bytes = std::max(max_bytes, n);
    specs += static_cast<int64_t>(r->segment_table().size() / daemon::kSegmentRecordBytes);
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf(
      "{\"case\":\"moe %d layers%s\",\"ranks\":%d,\"segments\":%zu,\"segment_records\":%lld,\"plan_ms\":%.1f,"
      "\"schedule_ms\":%.1f,\"digest_ms\":%.1f,\"encode_ms\":%.1f,\"total_ms\":%.1f,\"encoded_bytes\":%lld,"
      "\"max_rank_encoded_bytes\":%lld,\"digest\":\"%s\",\"peak_rss_mib\":%ld}\n",
      layers, dense ? " with dense tensors" : ", experts", epoch->plan.num_ranks, epoch->plan.segments.size(),
      static_cast<long long>(specs), epoch->timings.plan_seconds * 1e3, epoch->timings.schedule_seconds * 1e3,
      epoch->timings.digest_seconds * 1e3, epoch->timings.encode_seconds * 1e3, epoch->timings.total() * 1e3,
      static_cast<long long>(bytes), static_cast<long long>(max_bytes), epoch->digest.c_str(), usage.ru_maxrss / 1024);
  return 0;
}

}  // namespace
}  // namespace shardsync::bench

int main(int argc, char** argv) {
  int layers = 61;
  bool dense = false;
  int64_t staging_bytes = int64_t{128} << 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--moe-layers" && i + 1 < argc) {
      layers = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--dense") {
      dense = true;
    } else if (arg == "--staging-bytes" && i + 1 < argc) {
      staging_bytes = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: coordinator_plan_bench [--moe-layers N] [--dense] [--staging-bytes B]\n"
                   "  --moe-layers N      MoE layers (61)\n"
                   "  --dense             the dense tensors too (ZeRO-3 over all ranks; ~10 M segments a layer)\n"
                   "  --staging-bytes B   staging budget per peer (134217728)\n");
      return 2;
    }
  }
  return shardsync::bench::Run(layers, dense, staging_bytes);
}
