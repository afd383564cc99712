// Makes the schedule_codec_fuzzer's seed corpus: every rank's PrepareRequest, as the
// coordinator encodes it, for each layout spec given.
//   bazel run //tests/fuzz:make_schedule_seeds -- OUT_DIR SPEC.json...
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "daemon/common/schedule_codec.h"
#include "planner/plan.h"
#include "planner/schedule.h"
#include "spec/layout_spec.h"

int main(int argc, char** argv) {
  using namespace shardsync;
  if (argc < 3) {
    std::fprintf(stderr, "usage: make_schedule_seeds OUT_DIR SPEC.json...\n");
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    auto spec = spec::ReadLayoutSpecFile(argv[i]);
    spec::BufferIds ids;
    auto input = spec.ok() ? spec::ToPlanInput(*spec, ids) : spec.status();
    if (!input.ok()) {
      std::fprintf(stderr, "%s: %s\n", argv[i], std::string(input.status().message()).c_str());
      return 1;
    }
    // Each spec twice: on one node, and relayed over two (its ranks split in halves).
    int32_t ranks = 0;
    for (const planner::Buffer& b : input->buffers) ranks = std::max(ranks, b.holder.rank + 1);
    for (bool relay : {false, true}) {
      if (relay) {
        for (int32_t r = 0; r < ranks; ++r) input->node_of_rank.push_back(2 * r / std::max(ranks, 2));
      }
      auto plan = planner::MakePlan(*input, *planner::LocalFirstLeastLoaded(), planner::PlanOptions{relay});
      auto schedules = plan.ok() ? planner::MakeSchedules(*plan, 256) : plan.status();
      if (!schedules.ok()) {
        std::fprintf(stderr, "%s: %s\n", argv[i], std::string(schedules.status().message()).c_str());
        return 1;
      }
      if (relay && plan->stages == 1) continue;  // nothing to relay in this layout
      for (const planner::Schedule& schedule : *schedules) {
        const std::string name = std::filesystem::path(argv[i]).stem().string() + (relay ? "-relayed" : "") + "-r" +
                                 std::to_string(schedule.rank);
        std::ofstream(std::string(argv[1]) + "/" + name, std::ios::binary)
            << daemon::EncodeSchedule(*plan, schedule, ids.names()).SerializeAsString();
      }
    }
  }
  return 0;
}
