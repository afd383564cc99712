// shardsyncctl plan: the plan's report (v1.ExplainResponse, as explain prints it) as
// JSON and as tables.
#include "client/cli/plan_command.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "planner/box.h"
#include "planner/moe_layout.h"
#include "proto/shardsync.pb.h"

namespace shardsync::cli {
namespace {

using Catch::Matchers::Contains;
using Catch::Matchers::StartsWith;

// qwen3-0.6b from ZeRO-3 over ranks 0..3 into TP2 on ranks 0..1 and 2..3.
PlanCommandConfig SmallModel(bool json) {
  PlanCommandConfig config;
  config.model = "qwen3-0.6b";
  config.dp = 4;
  config.tp = 2;
  config.replicas = 2;
  config.json = json;
  return config;
}

std::string Plan(const PlanCommandConfig& config) {
  std::ostringstream out, err;
  const int code = RunPlanCommand(config, out, err);
  INFO(err.str());
  REQUIRE(code == 0);
  return out.str();
}

std::set<std::string> TopLevelNames(const std::string& json) {
  google::protobuf::Struct parsed;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &parsed);
  INFO(status.ToString());
  REQUIRE(status.ok());
  std::set<std::string> names;
  for (const auto& [name, value] : parsed.fields()) names.insert(name);
  return names;
}

TEST_CASE("plan --json prints the report as ExplainResponse JSON: its field names, every field, nothing else") {
  const std::string json = Plan(SmallModel(/*json=*/true));
  v1::ExplainResponse report;
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &report);  // refuses unknown names
  INFO(parsed.ToString());
  REQUIRE(parsed.ok());
  std::set<std::string> fields;
  for (int i = 0; i < v1::ExplainResponse::descriptor()->field_count(); ++i) {
    fields.insert(v1::ExplainResponse::descriptor()->field(i)->name());
  }
  CHECK(TopLevelNames(json) == fields);  // as explain --json prints them

  CHECK(report.layout_epoch() == 0);  // planned offline: no coordinator's epoch
  CHECK(report.digest().size() == 32);
  CHECK(report.tensors() > 0);
  CHECK(report.segments() > 0);
  CHECK(report.rounds() > 0);
  CHECK(report.stages() == 1);
  CHECK(report.floor_seconds() > 0);
  CHECK(report.link_gbps() == 360);
  CHECK(report.memory_gbps() == 4200);
  CHECK(report.network_gbps() == 50);
  REQUIRE(report.ranks_size() == 4);
  int64_t sent = 0, received = 0, linked = 0;
  for (int r = 0; r < report.ranks_size(); ++r) {
    CHECK(report.ranks(r).rank() == r);
    sent += report.ranks(r).sent_bytes();
    received += report.ranks(r).received_bytes();
  }
  CHECK(sent > 0);
  CHECK(received == sent);
  CHECK(report.links_size() == 0);  // only with --links
  PlanCommandConfig with_links = SmallModel(/*json=*/true);
  with_links.links = true;
  v1::ExplainResponse linked_report;
  REQUIRE(google::protobuf::util::JsonStringToMessage(Plan(with_links), &linked_report).ok());
  for (const v1::LinkBytes& l : linked_report.links()) linked += l.bytes();
  CHECK(linked == sent);
}

TEST_CASE("plan prints the same report as tables, with the bytes between nodes when the ranks span nodes") {
  v1::ExplainResponse report;
  REQUIRE(google::protobuf::util::JsonStringToMessage(Plan(SmallModel(/*json=*/true)), &report).ok());
  const std::string table = Plan(SmallModel(/*json=*/false));
  CHECK_THAT(table, StartsWith("plan of qwen3-0.6b zero3x4 -> tp2x2 (policy "));
  CHECK_THAT(table, Contains("digest " + report.digest() + ": " + std::to_string(report.tensors()) +
                             " tensors on 4 ranks, " + std::to_string(report.segments()) + " segments"));
  CHECK_THAT(table, Contains("imbalance ") && Contains("floor ") && Contains("planned in "));
  CHECK_THAT(table, !Contains("between nodes") && !Contains("links (from"));

  PlanCommandConfig nodes = SmallModel(/*json=*/false);
  nodes.rollout_rank = 4;
  nodes.ranks_per_node = 4;
  const std::string spanning = Plan(nodes);
  CHECK_THAT(spanning, Contains("between nodes ") && Contains("net received") && Contains("GB/s network"));
  // Ranks 4-7 take the rollout's bytes from node 0, relayed: each rank's NIC its share.
  CHECK_THAT(spanning, Contains("NICs (one a rank): into the busiest ") &&
                           Contains("x an even share over the 4 ranks that receive") &&
                           Contains("x an even share over the 4 that send"));
  nodes.json = true;
  REQUIRE(google::protobuf::util::JsonStringToMessage(Plan(nodes), &report).ok());
  CHECK(report.network_bytes() > 0);
  CHECK(report.unrelayed_floor_seconds() > 0);
}

TEST_CASE("plan of a mixture of experts writes every rollout rank's targets, the trainer's ranks receiving nothing") {
  PlanCommandConfig moe;
  moe.model = "qwen3-235b-sized";
  moe.layers = 1;
  moe.ep = 4;
  moe.dp = 2;  // trainer ranks 0..7
  moe.replicas = 2;
  moe.rollout_ep = 4;
  moe.tp = 1;
  moe.rollout_rank = 8;  // rollout ranks 8..15, on nodes 2 and 3
  moe.ranks_per_node = 4;
  moe.json = true;
  v1::ExplainResponse report;
  REQUIRE(google::protobuf::util::JsonStringToMessage(Plan(moe), &report).ok());
  REQUIRE(report.ranks_size() == 16);
  // What each rank's targets hold, from the layout the command planned.
  planner::MoeShape shape = *planner::MoePreset("qwen3-235b-sized", planner::MoeShape{});
  shape.layers = 1;
  shape.train_ep = 4;
  shape.train_dp = 2;
  shape.replicas = 2;
  shape.infer_ep = 4;
  shape.infer_tp = 1;
  shape.rollout_first_rank = 8;
  std::map<int32_t, int64_t> target_bytes;
  for (const planner::TensorLayouts& t : planner::MoeLayout(shape).tensors) {
    for (const planner::Placement& p : t.target.placements) {
      target_bytes[p.holder.rank] += planner::Volume(p.box) * planner::ElementBytes(t.target_dtype);
    }
  }
  REQUIRE(target_bytes.size() == 8);
  // Each EP rank of a replica holds its 32 experts (3 x 1536 x 4096 each) and the dense tensors.
  CHECK(target_bytes.at(8) > int64_t{32} * 3 * 1536 * 4096 * 2);
  int64_t into_rollout = 0;
  for (const v1::RankStats& r : report.ranks()) {
    INFO("rank " << r.rank());
    if (r.rank() < 8) {
      CHECK(r.received_bytes() == 0);
      CHECK(r.local_bytes() == 0);
    } else {
      CHECK(r.received_bytes() + r.local_bytes() == target_bytes.at(r.rank()));
      into_rollout += r.network_received_bytes();
    }
  }
  CHECK(report.network_bytes() == into_rollout);
  const std::string table = [&] {
    moe.json = false;
    return Plan(moe);
  }();
  CHECK_THAT(table, StartsWith("plan of qwen3-235b-sized 1 layers, ep4xdp2 -> 2x(ep4xtp1) from rank 8, 4 ranks "
                               "per node (policy "));
  CHECK_THAT(table, Contains("NICs (one a rank): into the busiest "));

  std::ostringstream out, err;
  moe.rollout_ep = 3;  // 128 experts do not divide over 3
  CHECK(RunPlanCommand(moe, out, err) == 3);
  CHECK_THAT(err.str(), Contains("128 experts do not divide over the rollout's EP of 3"));
}

TEST_CASE("plan of float8 targets reports what is quantized, the scratch, and a floor with the quantize pass") {
  const auto spec_of = [](const std::string& target_dtype) {
    const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + target_dtype + ".json";
    std::ofstream(path) << R"({"model": {"preset": "qwen3-0.6b", "zero_stage": 3, "dp_ranks": [0, 1, 2, 3],
        "replicas": [{"ranks": [0, 1]}, {"ranks": [2, 3]}], "target_dtype": ")"
                        << target_dtype << R"("}})";
    PlanCommandConfig config;
    config.spec_path = path;
    config.memory_gbps = 1;  // the memory dominates the floor: the quantize pass shows
    return config;
  };
  PlanCommandConfig float8 = spec_of("FLOAT8_E4M3");
  CHECK_THAT(Plan(float8), Contains("float8 targets: ") && Contains("the floor counts the quantize pass"));
  float8.json = true;
  v1::ExplainResponse quantized, plain;
  REQUIRE(google::protobuf::util::JsonStringToMessage(Plan(float8), &quantized).ok());
  PlanCommandConfig bfloat16 = spec_of("BFLOAT16");
  CHECK_THAT(Plan(bfloat16), !Contains("float8"));
  bfloat16.json = true;
  REQUIRE(google::protobuf::util::JsonStringToMessage(Plan(bfloat16), &plain).ok());
  for (const v1::RankStats& r : quantized.ranks()) {
    CHECK(r.quantized_bytes() > 0);
    CHECK(r.scratch_bytes() > 0);
    CHECK(r.scratch_bytes() <= int64_t{1} << 30);
    // The wire carries bfloat16 either way.
    CHECK(r.received_bytes() == plain.ranks(r.rank()).received_bytes());
  }
  CHECK(quantized.relayed_bytes() == 0);
  // Every rank receives, copies and quantizes its shards; the floor grows by the pass.
  CHECK(quantized.floor_seconds() > plain.floor_seconds() * 1.2);
}

TEST_CASE("plan refuses a spec it cannot read: exit 3, naming the file, nothing on stdout") {
  PlanCommandConfig config;
  config.spec_path = "/nonexistent/spec.json";
  config.json = true;
  std::ostringstream out, err;
  CHECK(RunPlanCommand(config, out, err) == 3);
  CHECK(out.str().empty());
  CHECK_THAT(err.str(), StartsWith("shardsyncctl plan: ") && Contains("/nonexistent/spec.json"));
}

TEST_CASE("plan refuses a rank past the world's limit, naming it, in a model and in a buffer") {
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::pair<std::string, std::string> specs[] = {
      {R"({"model": {"tensors": [{"name": "w", "shape": [8, 8], "style": "COLUMN"}], "zero_stage": 3,
           "dp_ranks": [0, 2147483647], "replicas": [{"ranks": [1]}]}})",
       "rank 2147483647 is outside 0..8191"},
      {R"({"model": {"tensors": [{"name": "w", "shape": [8, 8], "style": "COLUMN"}], "zero_stage": 3,
           "dp_ranks": [0], "replicas": [{"ranks": [16777216]}]}})",
       "rank 16777216 is outside 0..8191"},
      {R"({"buffers": [{"rank": 8192, "name": "s", "bytes": 32}, {"rank": 8192, "name": "t", "bytes": 32}],
           "sources": [{"name": "w", "shape": [8], "dtype": "FLOAT32",
                        "flat_placements": [{"rank": 8192, "buffer": "s", "begin": 0, "end": 8}]}],
           "targets": [{"name": "w", "shape": [8], "dtype": "FLOAT32",
                        "flat_placements": [{"rank": 8192, "buffer": "t", "begin": 0, "end": 8}]}]})",
       "is on rank 8192, outside the 8192 ranks"},
  };
  for (const auto& [json, why] : specs) {
    INFO(json);
    const std::string path = dir + "/big-rank.json";
    std::ofstream(path) << json;
    PlanCommandConfig config;
    config.spec_path = path;
    std::ostringstream out, err;
    CHECK(RunPlanCommand(config, out, err) == 3);
    CHECK_THAT(err.str(), Contains(why));
  }
}

}  // namespace
}  // namespace shardsync::cli
