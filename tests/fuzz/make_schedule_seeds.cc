// Makes the schedule_codec_fuzzer's seed corpus: every rank's PrepareRequest, as the
// coordinator encodes it, for each layout spec given.
//   bazel run //tests/fuzz:make_schedule_seeds -- OUT_DIR SPEC.json...
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
    auto plan = input.ok() ? planner::MakePlan(*input, *planner::LocalFirstLeastLoaded()) : input.status();
    auto schedules = plan.ok() ? planner::MakeSchedules(*plan, 256) : plan.status();
    if (!schedules.ok()) {
      std::fprintf(stderr, "%s: %s\n", argv[i], std::string(schedules.status().message()).c_str());
      return 1;
    }
    for (const planner::Schedule& schedule : *schedules) {
      const std::string name = std::filesystem::path(argv[i]).stem().string() + "-r" + std::to_string(schedule.rank);
      std::ofstream(std::string(argv[1]) + "/" + name, std::ios::binary)
          << daemon::EncodeSchedule(*plan, schedule, ids.names()).SerializeAsString();
    }
  }
  return 0;
}
