#include "planner/builders.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "planner/box.h"

namespace shardsync::planner {
namespace {

int64_t RowElements(const Index& trailing) { return NumElements(trailing); }

Index Prepend(int64_t rows, const Index& trailing) {
  Index shape{rows};
  shape.insert(shape.end(), trailing.begin(), trailing.end());
  return shape;
}

Placement RowsPlacement(int64_t row_lo, int64_t rows, const Index& full_shape, Holder holder, int64_t base) {
  Box box = FullBox(full_shape);
  box.lo[0] = row_lo;
  box.hi[0] = row_lo + rows;
  return Placement{std::move(box), holder, base, ContiguousStrides(full_shape)};
}

absl::Status CheckSameCount(size_t ranks, size_t offsets) {
  if (ranks != offsets || ranks == 0) {
    return absl::InvalidArgumentError(absl::StrCat("builder needs one offset per rank and at least one rank; got ",
                                                   ranks, " ranks and ", offsets, " offsets"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t Zero3PartitionSize(int64_t numel, int world) { return (numel + world - 1) / world; }

std::vector<int64_t> Zero3Offsets(const std::vector<int64_t>& numels, int world) {
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (int64_t n : numels) {
    offsets.push_back(at);
    at += Zero3PartitionSize(n, world);
  }
  offsets.push_back(at);
  return offsets;
}

std::vector<int64_t> Zero12Offsets(const std::vector<int64_t>& numels, int world) {
  std::vector<int64_t> offsets;
  int64_t at = 0;
  for (int64_t n : numels) {
    offsets.push_back(at);
    at += n;
  }
  const int64_t align = 2 * static_cast<int64_t>(world);
  offsets.push_back((at + align - 1) / align * align);
  return offsets;
}

Layout Zero3(const Index& shape, const std::vector<int32_t>& ranks, int32_t buffer, int64_t offset) {
  Layout layout;
  const int64_t n = NumElements(shape);
  const int world = static_cast<int>(ranks.size());
  const int64_t p = Zero3PartitionSize(n, world);
  const Index strides = ContiguousStrides(shape);
  for (int r = 0; r < world; ++r) {
    const int64_t begin = r * p;
    const int64_t held = std::clamp<int64_t>(n - begin, 0, p);
    for (Box& box : FlatIntervalToBoxes(shape, begin, begin + held)) {
      int64_t flat = 0;
      for (size_t k = 0; k < shape.size(); ++k) flat += box.lo[k] * strides[k];
      layout.placements.push_back(Placement{std::move(box), Holder{ranks[r], buffer}, offset + flat - begin, strides});
    }
  }
  return layout;
}

Layout Zero12(const Index& shape, const std::vector<int32_t>& ranks, int32_t buffer, int64_t offset) {
  return Replicated(shape, ranks, buffer, std::vector<int64_t>(ranks.size(), offset));
}

Layout Replicated(const Index& shape, const std::vector<int32_t>& ranks, int32_t buffer,
                  const std::vector<int64_t>& offsets) {
  Layout layout;
  for (size_t i = 0; i < ranks.size(); ++i) {
    layout.placements.push_back(
        Placement{FullBox(shape), Holder{ranks[i], buffer}, offsets.at(i), ContiguousStrides(shape)});
  }
  return layout;
}

std::vector<int64_t> UnevenSplit(int64_t total, int parts) {
  std::vector<int64_t> sizes;
  for (int r = 0; r < parts; ++r) sizes.push_back(total / parts + (r < total % parts ? 1 : 0));
  return sizes;
}

absl::StatusOr<Layout> TpSplit(const Index& shape, int axis, const std::vector<int64_t>& sizes,
                               const std::vector<int32_t>& ranks, int32_t buffer, const std::vector<int64_t>& offsets) {
  SHARDSYNC_RETURN_IF_ERROR(CheckSameCount(ranks.size(), offsets.size()));
  if (axis < 0 || axis >= static_cast<int>(shape.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_split axis ", axis, " outside a tensor of shape ", IndexToString(shape)));
  }
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  if (sizes.size() != ranks.size() || total != shape[axis]) {
    return absl::InvalidArgumentError(absl::StrCat("tp_split sizes of ", sizes.size(), " ranks sum to ", total,
                                                   ", not to axis ", axis, " of shape ", IndexToString(shape)));
  }
  Layout layout;
  int64_t start = 0;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (sizes[i] > 0) {
      Box box = FullBox(shape);
      box.lo[axis] = start;
      box.hi[axis] = start + sizes[i];
      Index shard = Extent(box);
      layout.placements.push_back(
          Placement{std::move(box), Holder{ranks[i], buffer}, offsets[i], ContiguousStrides(shard)});
    }
    start += sizes[i];
  }
  return layout;
}

absl::StatusOr<Layout> Nest(const Layout& outer, const std::vector<Layout>& inner) {
  Layout out;
  for (const Placement& o : outer.placements) {
    if (o.holder.rank < 0 || o.holder.rank >= static_cast<int32_t>(inner.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("nest: outer placement names inner layout ", o.holder.rank, " of ", inner.size()));
    }
    const Box own = FullBox(Extent(o.box));
    const Layout& in = inner[o.holder.rank];
    for (const Placement& p : in.placements) {
      if (!Contains(own, p.box)) {
        return absl::InvalidArgumentError(absl::StrCat("nest: inner box ", BoxToString(p.box),
                                                       " lies outside its outer box of extent ",
                                                       IndexToString(Extent(o.box))));
      }
      Placement composed = p;
      for (size_t k = 0; k < o.box.lo.size(); ++k) {
        composed.box.lo[k] += o.box.lo[k];
        composed.box.hi[k] += o.box.lo[k];
      }
      out.placements.push_back(std::move(composed));
    }
    out.fills.insert(out.fills.end(), in.fills.begin(), in.fills.end());
  }
  return out;
}

int64_t FusedQkvShardRows(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int tp) {
  if (tp <= 0 || num_heads % tp != 0) return 0;
  const int64_t nkv = tp >= num_kv_heads ? 1 : num_kv_heads / tp;
  return (num_heads / tp + 2 * nkv) * head_dim;
}

absl::StatusOr<QkvViews> FusedQkv(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, const Index& trailing,
                                  const std::vector<int32_t>& ranks, int32_t buffer,
                                  const std::vector<int64_t>& offsets) {
  SHARDSYNC_RETURN_IF_ERROR(CheckSameCount(ranks.size(), offsets.size()));
  const int64_t tp = static_cast<int64_t>(ranks.size());
  const bool kv_replicated = tp >= num_kv_heads;
  if (num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 || num_heads % tp != 0 ||
      (kv_replicated ? tp % num_kv_heads != 0 : num_kv_heads % tp != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fused qkv: ", num_heads, " heads and ", num_kv_heads, " kv heads do not split over tp=", tp));
  }
  const int64_t nh = num_heads / tp;
  const int64_t nkv = kv_replicated ? 1 : num_kv_heads / tp;
  const int64_t rep = kv_replicated ? tp / num_kv_heads : 1;
  const int64_t row = RowElements(trailing);
  const Index q_shape = Prepend(num_heads * head_dim, trailing);
  const Index kv_shape = Prepend(num_kv_heads * head_dim, trailing);
  QkvViews views;
  for (int64_t r = 0; r < tp; ++r) {
    const Holder holder{ranks[r], buffer};
    const int64_t s = r / rep;
    views.q.placements.push_back(RowsPlacement(r * nh * head_dim, nh * head_dim, q_shape, holder, offsets[r]));
    views.k.placements.push_back(
        RowsPlacement(s * nkv * head_dim, nkv * head_dim, kv_shape, holder, offsets[r] + nh * head_dim * row));
    views.v.placements.push_back(
        RowsPlacement(s * nkv * head_dim, nkv * head_dim, kv_shape, holder, offsets[r] + (nh + nkv) * head_dim * row));
  }
  return views;
}

absl::StatusOr<std::vector<Layout>> FusedRows(const std::vector<int64_t>& rows, const Index& trailing,
                                              const std::vector<int32_t>& ranks, int32_t buffer,
                                              const std::vector<int64_t>& offsets) {
  SHARDSYNC_RETURN_IF_ERROR(CheckSameCount(ranks.size(), offsets.size()));
  const int64_t tp = static_cast<int64_t>(ranks.size());
  const int64_t row = RowElements(trailing);
  std::vector<Layout> layouts(rows.size());
  int64_t local_row = 0;
  for (size_t k = 0; k < rows.size(); ++k) {
    if (rows[k] % tp != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("fused rows: sub-weight ", k, " has ", rows[k], " rows, not a multiple of tp=", tp));
    }
    const int64_t part = rows[k] / tp;
    const Index shape = Prepend(rows[k], trailing);
    for (int64_t r = 0; r < tp; ++r) {
      layouts[k].placements.push_back(
          RowsPlacement(r * part, part, shape, Holder{ranks[r], buffer}, offsets[r] + local_row * row));
    }
    local_row += part;
  }
  return layouts;
}

int64_t PaddedVocabShardRows(int64_t vocab, int tp) {
  const int64_t padded = (vocab + kVocabPadding - 1) / kVocabPadding * kVocabPadding;
  return tp > 0 && padded % tp == 0 ? padded / tp : 0;
}

absl::StatusOr<Layout> PaddedVocab(int64_t vocab, const Index& trailing, const std::vector<int32_t>& ranks,
                                   int32_t buffer, const std::vector<int64_t>& offsets) {
  SHARDSYNC_RETURN_IF_ERROR(CheckSameCount(ranks.size(), offsets.size()));
  const int tp = static_cast<int>(ranks.size());
  const int64_t per = PaddedVocabShardRows(vocab, tp);
  if (vocab <= 0 || per == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("padded vocab: ", vocab, " rows padded to a multiple of 64 do not split over tp=", tp));
  }
  const int64_t row = RowElements(trailing);
  const Index shape = Prepend(vocab, trailing);
  Layout layout;
  for (int r = 0; r < tp; ++r) {
    const Holder holder{ranks[r], buffer};
    const int64_t lo = r * per, hi = (r + 1) * per;
    const int64_t real_hi = std::min(hi, vocab);
    if (real_hi > lo) layout.placements.push_back(RowsPlacement(lo, real_hi - lo, shape, holder, offsets[r]));
    const int64_t pad_lo = std::max(lo, vocab);
    if (hi > pad_lo) {
      const Index pad_shape = Prepend(hi - pad_lo, trailing);
      layout.fills.push_back(Fill{holder, offsets[r] + (pad_lo - lo) * row, pad_shape, ContiguousStrides(pad_shape)});
    }
  }
  return layout;
}

Layout Concat(std::vector<Layout> layouts) {
  Layout out;
  for (Layout& l : layouts) {
    out.placements.insert(out.placements.end(), l.placements.begin(), l.placements.end());
    out.fills.insert(out.fills.end(), l.fills.begin(), l.fills.end());
  }
  return out;
}

}  // namespace shardsync::planner
