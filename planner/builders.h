// Layout builders for the storage schemes of DeepSpeed ZeRO and of tensor-parallel
// inference engines (vLLM / SGLang). Each builder's comment states the framework's
// storage fact it matches; tests/planner/builders_test.cc pins them.
// Ranks are given per index: `ranks[i]` is the global rank of DP index / TP rank i.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/types.h"

namespace shardsync::planner {

// ZeRO-3 partition size of a parameter of `numel` elements over `world` ranks.
int64_t Zero3PartitionSize(int64_t numel, int world);
// Element offsets of consecutive ZeRO-3 partitions in one flat buffer (one per param).
std::vector<int64_t> Zero3Offsets(const std::vector<int64_t>& numels, int world);
// Element offsets of params in a ZeRO-1/2 flat group; the last entry is the padded
// length of the flat (a multiple of 2 * world).
std::vector<int64_t> Zero12Offsets(const std::vector<int64_t>& numels, int world);

// ZeRO-3: DP index r holds flat [r*p, r*p + v_r) at buffer[offset, offset + v_r).
Layout Zero3(const Index& shape, const std::vector<int32_t>& ranks, int32_t buffer, int64_t offset);
// ZeRO-1/2 bf16: the whole tensor, contiguous at `offset`, on every DP rank.
Layout Zero12(const Index& shape, const std::vector<int32_t>& ranks, int32_t buffer, int64_t offset);
// The whole tensor, contiguous at offsets[i], on every rank.
Layout Replicated(const Index& shape, const std::vector<int32_t>& ranks, int32_t buffer,
                  const std::vector<int64_t>& offsets);

// AutoTP split of `total` units over `parts`: part r gets total/parts + (r < total % parts).
std::vector<int64_t> UnevenSplit(int64_t total, int parts);
// Rank i holds `sizes[i]` consecutive indices of `axis` (after those of ranks < i),
// stored contiguously in its own shard shape at offsets[i].
absl::StatusOr<Layout> TpSplit(const Index& shape, int axis, const std::vector<int64_t>& sizes,
                               const std::vector<int32_t>& ranks, int32_t buffer, const std::vector<int64_t>& offsets);

// Composes layouts: `outer` names virtual holders (holder.rank = index into `inner`);
// inner[i] lays out outer box i in that box's own coordinates on real holders. Used for
// a TP shard that is itself ZeRO-partitioned, or one TP layout held by several replicas.
absl::StatusOr<Layout> Nest(const Layout& outer, const std::vector<Layout>& inner);

// Fused QKV target views (vLLM QKVParallelLinear): rank i's shard of the fused weight is
// [(nh + 2*nkv) * head_dim, cols...] contiguous at offsets[i].
struct QkvViews {
  Layout q, k, v;
};
absl::StatusOr<QkvViews> FusedQkv(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, const Index& trailing,
                                  const std::vector<int32_t>& ranks, int32_t buffer,
                                  const std::vector<int64_t>& offsets);
// Rows of rank i's fused QKV shard; 0 if the heads do not split over tp.
int64_t FusedQkvShardRows(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, int tp);

// Fused gate_up-style targets (MergedColumnParallelLinear): sub-weight k of `rows[k]`
// rows lands at local rows [sum_{j<k} rows[j]/tp, +rows[k]/tp) of rank i's shard.
absl::StatusOr<std::vector<Layout>> FusedRows(const std::vector<int64_t>& rows, const Index& trailing,
                                              const std::vector<int32_t>& ranks, int32_t buffer,
                                              const std::vector<int64_t>& offsets);

// Vocabulary padded to a multiple of 64 (VocabParallelEmbedding / ParallelLMHead); rank
// i holds Vp/tp rows at offsets[i]; rows past `vocab` are zero fills.
inline constexpr int64_t kVocabPadding = 64;
absl::StatusOr<Layout> PaddedVocab(int64_t vocab, const Index& trailing, const std::vector<int32_t>& ranks,
                                   int32_t buffer, const std::vector<int64_t>& offsets);
int64_t PaddedVocabShardRows(int64_t vocab, int tp);

// Concatenates layouts (several replicas, tied weights sharing one source).
Layout Concat(std::vector<Layout> layouts);

}  // namespace shardsync::planner
