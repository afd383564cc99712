// The small model and rollout layouts the end-to-end tests deploy, and their helpers.
#pragma once

#include <catch2/catch.hpp>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tools/localsync/deployment.h"

namespace shardsync::localsync {

// A small model with every kind of tensor: padded vocab, heads split unevenly over
// TP=4 (6 heads -> 2,2,1,1), row-parallel, replicated norm, a 3-D tensor of 7 rows.
inline std::string ModelJson(int zero_stage, const std::string& replicas, const std::string& dp = "[0, 1, 2, 3]") {
  return absl::StrCat(R"({"model": {"tensors": [
      {"name": "embed", "shape": [100, 16], "style": "VOCAB"},
      {"name": "heads", "shape": [24, 16], "style": "COLUMN", "split_unit": 4},
      {"name": "o_proj", "shape": [16, 24], "style": "ROW", "split_unit": 4},
      {"name": "norm", "shape": [16]},
      {"name": "up", "shape": [40, 16], "style": "COLUMN"},
      {"name": "down", "shape": [16, 40], "style": "ROW"},
      {"name": "cube", "shape": [7, 5, 3], "style": "COLUMN"}],
    "zero_stage": )",
                      zero_stage, R"(, "dp_ranks": )", dp, R"(, "replicas": )", replicas, "}}");
}

struct Layout {
  const char* name;
  const char* replicas;
  int first_target_rank = 0;  // a rank that holds targets
};
inline constexpr Layout kLayouts[] = {
    {"tp2x2", R"([{"ranks": [0, 1]}, {"ranks": [2, 3]}])"},
    {"tp4", R"([{"ranks": [0, 1, 2, 3]}])"},
    {"tp1-on-half", R"([{"ranks": [0]}, {"ranks": [2]}])"},
    {"tp1x4", R"([{"ranks": [0]}, {"ranks": [1]}, {"ranks": [2]}, {"ranks": [3]}])"},
    {"tp2-on-ranks-2-3", R"([{"ranks": [2, 3]}])", 2},
};

inline void RequireReady(Deployment& deployment) {
  for (const std::string& line : deployment.WaitReady()) REQUIRE_THAT(line, Catch::Matchers::StartsWith("ready"));
}

// A repeated rank field as a vector, to compare.
inline std::vector<int32_t> Ranks(const google::protobuf::RepeatedField<int32_t>& ranks) {
  return {ranks.begin(), ranks.end()};
}

// Two 1 MiB tensors over 4 ranks: with small staging, many rounds per sync.
inline std::string ManyRoundsModelJson() {
  return R"({"model": {"tensors": [
      {"name": "big", "shape": [1024, 512], "style": "COLUMN"},
      {"name": "wide", "shape": [512, 1024], "style": "ROW"}],
    "zero_stage": 3, "dp_ranks": [0, 1, 2, 3], "replicas": [{"ranks": [0, 1, 2, 3]}]}})";
}

// Waits until the log file at `path` contains `text`; false at the deadline.
inline bool WaitForLogLine(const std::string& path, const std::string& text, absl::Duration timeout) {
  for (const absl::Time deadline = absl::Now() + timeout; absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(10))) {
    std::ifstream log(path);
    if (std::string(std::istreambuf_iterator<char>(log), {}).find(text) != std::string::npos) return true;
  }
  return false;
}

// Starts `rank`'s killed agent again and registers its trainer and rollout again.
inline void RestartAgent(Cluster& cluster, Deployment& deployment, int rank) {
  cluster.agent(rank).Wait(absl::Seconds(5));
  cluster.StartAgent(rank);
  for (Process* client : {&deployment.trainer(rank), &deployment.rollout(rank)}) {
    client->WriteLine("reregister");
    CHECK_THAT(client->ReadLine(absl::Seconds(20)), Catch::Matchers::StartsWith("ready"));
  }
  REQUIRE(deployment.WaitPublished());
}

}  // namespace shardsync::localsync
