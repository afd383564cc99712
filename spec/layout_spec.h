// The layout spec: the JSON mapping of shardsync.v1.LayoutSpec (proto/layout.proto),
// converted to planner types here, at the edge. Files, RPCs and tests share one
// vocabulary. See docs/layout-spec.md.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/plan.h"
#include "planner/types.h"
#include "proto/layout.pb.h"

namespace shardsync::spec {

// Buffer names to the planner's integer ids; one id per name, the same on every rank.
class BufferIds {
 public:
  int32_t Id(const std::string& name);
  const std::string& Name(int32_t id) const { return names_.at(id); }
  const std::vector<std::string>& names() const { return names_; }  // by id

 private:
  std::map<std::string, int32_t> ids_;
  std::vector<std::string> names_;
};

absl::StatusOr<v1::LayoutSpec> ParseLayoutSpecJson(absl::string_view json);
absl::StatusOr<v1::LayoutSpec> ReadLayoutSpecFile(const std::string& path);

absl::StatusOr<planner::DType> ToDType(v1::DType dtype);
v1::DType FromDType(planner::DType dtype);
absl::StatusOr<planner::TensorSide> ToTensorSide(const v1::TensorLayout& layout, BufferIds& ids);

// What one rank's client registers for `role`: the rank's buffers that hold that side,
// and every tensor's placements and fills on them (planner -> proto).
struct RankSide {
  std::vector<v1::BufferInfo> buffers;
  std::vector<v1::TensorLayout> tensors;
};
RankSide RankLayouts(const planner::PlanInput& input, const BufferIds& ids, int32_t rank, bool sources);

// Expands the model shorthand and matches explicit sources with targets.
absl::StatusOr<planner::PlanInput> ToPlanInput(const v1::LayoutSpec& spec, BufferIds& ids);

}  // namespace shardsync::spec
