// What shardsyncctl prints of responses: any of them as JSON, and the plan report
// (v1.ExplainResponse, daemon/common/plan_report.h) of `plan` and `explain` as tables.
#pragma once

#include <ostream>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "proto/shardsync.pb.h"

namespace shardsync::cli {

// `message` as one line of JSON: proto field names, every field (defaults too).
void PrintJson(const google::protobuf::Message& message, std::ostream& out);

// `report` as tables: a first line "`title`, digest ...: counts", the bytes moved, the
// bytes between nodes (when the plan spans nodes), the floor, the imbalance, a row per
// rank, and with `links` the bytes of every link.
void PrintPlanReport(const v1::ExplainResponse& report, absl::string_view title, bool links, std::ostream& out);

}  // namespace shardsync::cli
