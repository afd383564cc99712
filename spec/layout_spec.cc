#include "spec/layout_spec.h"

#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "planner/box.h"
#include "planner/known_models.h"
#include "planner/model_layout.h"
#include "planner/quantize.h"
#include "planner/validate.h"

namespace shardsync::spec {
namespace {

planner::Index ToIndex(const google::protobuf::RepeatedField<int64_t>& values) {
  return planner::Index(values.begin(), values.end());
}

absl::StatusOr<planner::ModelLayoutSpec> ToModel(const v1::ModelLayout& m, BufferIds& ids) {
  planner::ModelLayoutSpec model;
  if (!m.preset().empty()) {
    if (m.tensors_size() > 0) return absl::InvalidArgumentError("model: give either a preset or tensors, not both");
    SHARDSYNC_ASSIGN_OR_RETURN(auto config, planner::FindDenseModel(m.preset()));
    model = planner::Qwen3Layout(config, m.fused());
  }
  for (const v1::ModelTensor& t : m.tensors()) {
    planner::ModelTensor tensor;
    tensor.name = t.name();
    tensor.shape = ToIndex(t.shape());
    if (t.dtype() != v1::DTYPE_UNSPECIFIED) {
      SHARDSYNC_ASSIGN_OR_RETURN(tensor.dtype, ToDType(t.dtype()));
    }
    tensor.style = static_cast<planner::TpStyle>(t.style());
    tensor.split_unit = t.split_unit() == 0 ? 1 : t.split_unit();
    tensor.tied_to = t.tied_to();
    model.tensors.push_back(std::move(tensor));
  }
  for (const v1::FusedQkv& g : m.fused_qkv()) {
    model.fused_qkv.push_back(
        planner::FusedQkvGroup{g.q(), g.k(), g.v(), g.num_heads(), g.num_kv_heads(), g.head_dim()});
  }
  for (const v1::FusedRows& g : m.fused_rows()) {
    model.fused_rows.push_back(planner::FusedRowsGroup{{g.parts().begin(), g.parts().end()}});
  }
  model.zero_stage = m.zero_stage();
  model.dp_ranks.assign(m.dp_ranks().begin(), m.dp_ranks().end());
  for (const v1::Replica& r : m.replicas()) model.replicas.emplace_back(r.ranks().begin(), r.ranks().end());
  // Layouts are built per rank: a rank past the world's limit would size them by it.
  std::vector<int32_t> ranks = model.dp_ranks;
  for (const std::vector<int32_t>& replica : model.replicas) ranks.insert(ranks.end(), replica.begin(), replica.end());
  for (int32_t rank : ranks) {
    if (rank < 0 || rank >= kMaxWorld) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: rank ", rank, " is outside 0..", kMaxWorld - 1, ", the ranks one coordinator serves"));
    }
  }
  if (m.target_dtype() != v1::DTYPE_UNSPECIFIED) {
    SHARDSYNC_ASSIGN_OR_RETURN(model.target_dtype, ToDType(m.target_dtype()));
  }
  model.source_buffer = ids.Id("zero_flat");
  model.target_buffer = ids.Id("arena");
  return model;
}

}  // namespace

int32_t BufferIds::Id(const std::string& name) {
  auto [it, added] = ids_.emplace(name, static_cast<int32_t>(names_.size()));
  if (added) names_.push_back(name);
  return it->second;
}

absl::StatusOr<v1::LayoutSpec> ParseLayoutSpecJson(absl::string_view json) {
  v1::LayoutSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;  // a misspelt key is an error, not a silent default
  const auto status = google::protobuf::util::JsonStringToMessage(std::string(json), &spec, options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("layout spec: ", std::string(status.message())));
  }
  return spec;
}

absl::StatusOr<v1::LayoutSpec> ReadLayoutSpecFile(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot read layout spec '", path, "'"));
  std::stringstream text;
  text << file.rdbuf();
  auto spec = ParseLayoutSpecJson(text.str());
  if (!spec.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", spec.status().message()));
  return spec;
}

absl::StatusOr<planner::DType> ToDType(v1::DType dtype) {
  switch (dtype) {
    case v1::FLOAT32:
      return planner::DType::kFloat32;
    case v1::BFLOAT16:
      return planner::DType::kBFloat16;
    case v1::FLOAT16:
      return planner::DType::kFloat16;
    case v1::FLOAT8_E4M3:
      return planner::DType::kFloat8E4M3;
    case v1::FLOAT8_E5M2:
      return planner::DType::kFloat8E5M2;
    case v1::INT64:
      return planner::DType::kInt64;
    case v1::INT32:
      return planner::DType::kInt32;
    case v1::INT8:
      return planner::DType::kInt8;
    case v1::UINT8:
      return planner::DType::kUInt8;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unsupported dtype ", static_cast<int>(dtype)));
  }
}

v1::DType FromDType(planner::DType dtype) {
  for (int v = v1::FLOAT32; v <= v1::UINT8; ++v) {
    auto converted = ToDType(static_cast<v1::DType>(v));
    if (converted.ok() && *converted == dtype) return static_cast<v1::DType>(v);
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<planner::TensorSide> ToTensorSide(const v1::TensorLayout& layout, BufferIds& ids) {
  planner::TensorSide side;
  side.name = layout.name();
  side.shape = ToIndex(layout.shape());
  auto dtype = ToDType(layout.dtype());
  if (!dtype.ok())
    return absl::InvalidArgumentError(absl::StrCat("tensor '", side.name, "': ", dtype.status().message()));
  side.dtype = *dtype;
  for (const v1::Placement& p : layout.placements()) {
    planner::Placement placement;
    placement.box = planner::Box{ToIndex(p.box().lo()), ToIndex(p.box().hi())};
    // Before anything reads the box: Extent needs lo and hi of one length (found by the fuzzer).
    if (placement.box.lo.size() != placement.box.hi.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", side.name, "': a box on rank ", p.rank(), " has ",
                                                     placement.box.lo.size(), " lo and ", placement.box.hi.size(),
                                                     " hi values"));
    }
    placement.holder = planner::Holder{p.rank(), ids.Id(p.buffer())};
    placement.base = p.base();
    placement.strides =
        p.strides().empty() ? planner::ContiguousStrides(planner::Extent(placement.box)) : ToIndex(p.strides());
    side.layout.placements.push_back(std::move(placement));
  }
  // Before anything counts elements: a shape whose count overflows is named as such.
  SHARDSYNC_RETURN_IF_ERROR(planner::ValidateShape(side.name, side.shape));
  for (const v1::FlatPlacement& f : layout.flat_placements()) {
    const int64_t numel = planner::NumElements(side.shape);
    if (f.begin() < 0 || f.begin() > f.end() || f.end() > numel) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", side.name, "': flat placement [", f.begin(), ", ",
                                                     f.end(), ") on rank ", f.rank(), " lies outside its ", numel,
                                                     " elements"));
    }
    const planner::Index strides = planner::ContiguousStrides(side.shape);
    for (planner::Box& box : planner::FlatIntervalToBoxes(side.shape, f.begin(), f.end())) {
      int64_t flat = 0;
      for (size_t k = 0; k < box.lo.size(); ++k) flat += box.lo[k] * strides[k];
      side.layout.placements.push_back(planner::Placement{std::move(box), planner::Holder{f.rank(), ids.Id(f.buffer())},
                                                          f.base() + flat - f.begin(), strides});
    }
  }
  if (layout.block_scales_size() > 0 && layout.flat_placements_size() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", side.name, "': block scales need box placements, not flat ones"));
  }
  for (int i = 0; i < layout.block_scales_size(); ++i) {
    const v1::BlockScales& scales = layout.block_scales(i);
    int64_t row_stride = scales.row_stride();
    if (row_stride == 0 && i < static_cast<int>(side.layout.placements.size())) {
      const planner::Box& box = side.layout.placements[i].box;
      if (box.lo.size() == 2) row_stride = planner::ScaleBlocks(box.hi[1] - box.lo[1]);
    }
    side.scales.push_back(
        planner::BlockScales{planner::Holder{scales.rank(), ids.Id(scales.buffer())}, scales.base(), row_stride});
  }
  for (const v1::Fill& f : layout.fills()) {
    const planner::Index shape = ToIndex(f.shape());
    side.layout.fills.push_back(
        planner::Fill{planner::Holder{f.rank(), ids.Id(f.buffer())}, f.base(), shape,
                      f.strides().empty() ? planner::ContiguousStrides(shape) : ToIndex(f.strides())});
  }
  return side;
}

RankSide RankLayouts(const planner::PlanInput& input, const BufferIds& ids, int32_t rank, bool sources) {
  RankSide side;
  std::map<int32_t, bool> used;  // buffer ids this side places anything in
  for (const planner::TensorLayouts& t : input.tensors) {
    const planner::Layout& layout = sources ? t.source : t.target;
    v1::TensorLayout out;
    out.set_name(t.name);
    for (int64_t v : t.shape) out.add_shape(v);
    out.set_dtype(FromDType(sources ? t.source_dtype : t.target_dtype));
    for (size_t i = 0; i < layout.placements.size(); ++i) {
      const planner::Placement& p = layout.placements[i];
      if (p.holder.rank != rank) continue;
      used[p.holder.buffer] = true;
      if (!sources && !t.target_scales.empty()) {
        const planner::BlockScales& scales = t.target_scales[i];
        used[scales.holder.buffer] = true;
        v1::BlockScales* out_scales = out.add_block_scales();
        out_scales->set_rank(rank);
        out_scales->set_buffer(ids.Name(scales.holder.buffer));
        out_scales->set_base(scales.base);
        out_scales->set_row_stride(scales.row_stride);
      }
      v1::Placement* placement = out.add_placements();
      for (size_t k = 0; k < p.box.lo.size(); ++k) {
        placement->mutable_box()->add_lo(p.box.lo[k]);
        placement->mutable_box()->add_hi(p.box.hi[k]);
      }
      placement->set_rank(rank);
      placement->set_buffer(ids.Name(p.holder.buffer));
      placement->set_base(p.base);
      for (int64_t v : p.strides) placement->add_strides(v);
    }
    for (const planner::Fill& f : layout.fills) {
      if (f.holder.rank != rank) continue;
      used[f.holder.buffer] = true;
      v1::Fill* fill = out.add_fills();
      fill->set_rank(rank);
      fill->set_buffer(ids.Name(f.holder.buffer));
      fill->set_base(f.base);
      for (int64_t v : f.shape) fill->add_shape(v);
      for (int64_t v : f.strides) fill->add_strides(v);
    }
    if (out.placements_size() > 0 || out.fills_size() > 0) side.tensors.push_back(std::move(out));
  }
  for (const planner::Buffer& b : input.buffers) {
    if (b.holder.rank != rank || !used.count(b.holder.buffer)) continue;
    v1::BufferInfo info;
    info.set_rank(rank);
    info.set_name(ids.Name(b.holder.buffer));
    info.set_bytes(b.bytes);
    side.buffers.push_back(std::move(info));
  }
  return side;
}

absl::StatusOr<planner::PlanInput> ToPlanInput(const v1::LayoutSpec& spec, BufferIds& ids) {
  planner::PlanInput input;
  if (spec.has_model()) {
    SHARDSYNC_ASSIGN_OR_RETURN(auto model, ToModel(spec.model(), ids));
    SHARDSYNC_ASSIGN_OR_RETURN(input, planner::ExpandModel(model));
  }
  for (const v1::BufferInfo& b : spec.buffers()) {
    input.buffers.push_back(planner::Buffer{planner::Holder{b.rank(), ids.Id(b.name())}, b.bytes(), b.name()});
  }
  std::vector<planner::TensorSide> sources, targets;
  for (const auto* side : {&spec.sources(), &spec.targets()}) {
    for (const v1::TensorLayout& layout : *side) {
      SHARDSYNC_ASSIGN_OR_RETURN(auto converted, ToTensorSide(layout, ids));
      (side == &spec.sources() ? sources : targets).push_back(std::move(converted));
    }
  }
  SHARDSYNC_ASSIGN_OR_RETURN(auto matched, planner::MatchTensors(sources, targets));
  for (planner::TensorLayouts& t : matched) input.tensors.push_back(std::move(t));
  if (input.tensors.empty()) return absl::InvalidArgumentError("layout spec names no tensor to move");
  return input;
}

}  // namespace shardsync::spec
