#include "tests/e2e/contents.h"

#include <cstring>
#include <functional>
#include <string>

#include "planner/box.h"
#include "tests/planner/reference_executor.h"

namespace shardsync::e2e {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Logical values of a tensor in its source dtype.
std::vector<uint8_t> Values(const planner::TensorLayouts& t, uint64_t seed) {
  const uint64_t salt = Mix(seed ^ std::hash<std::string>()(t.name));
  std::vector<uint8_t> v(planner::NumElements(t.shape) * planner::ElementBytes(t.source_dtype));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>(Mix(salt + i) | 1);
  return v;
}

void ForEachElement(const planner::Placement& p, const planner::Index& shape,
                    const std::function<void(int64_t flat, int64_t at)>& fn) {
  const planner::Index extent = planner::Extent(p.box);
  if (planner::NumElements(extent) == 0) return;
  const planner::Index strides = planner::ContiguousStrides(shape);
  planner::Index i(extent.size(), 0);
  while (true) {
    int64_t flat = 0, at = p.base;
    for (size_t k = 0; k < i.size(); ++k) {
      flat += (p.box.lo[k] + i[k]) * strides[k];
      at += i[k] * p.strides[k];
    }
    fn(flat, at);
    int k = static_cast<int>(i.size()) - 1;
    while (k >= 0 && ++i[k] == extent[k]) i[k--] = 0;
    if (k < 0) return;
  }
}

}  // namespace

std::vector<uint8_t> PoisonedBuffer(int64_t bytes, planner::Holder holder, uint64_t poison) {
  std::vector<uint8_t> data(bytes);
  const uint64_t salt = Mix(poison ^ (static_cast<uint64_t>(holder.rank) << 32) ^ holder.buffer);
  for (int64_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(Mix(salt + i));
  return data;
}

Contents SourceContents(const planner::PlanInput& input, uint64_t seed) {
  Contents contents;
  std::map<planner::Holder, int64_t> sizes;
  for (const planner::Buffer& b : input.buffers) sizes[b.holder] = b.bytes;
  for (const planner::TensorLayouts& t : input.tensors) {
    const std::vector<uint8_t> values = Values(t, seed);
    const int64_t element = planner::ElementBytes(t.source_dtype);
    for (const planner::Placement& p : t.source.placements) {
      auto [it, added] = contents.emplace(p.holder, std::vector<uint8_t>());
      if (added) it->second = PoisonedBuffer(sizes.at(p.holder), p.holder, seed);
      ForEachElement(p, t.shape, [&](int64_t flat, int64_t at) {
        std::memcpy(it->second.data() + at * element, values.data() + flat * element, element);
      });
    }
  }
  return contents;
}

Contents ExpectedTargets(const planner::PlanInput& input, uint64_t seed, uint64_t poison) {
  Contents contents;
  std::map<planner::Holder, int64_t> sizes;
  for (const planner::Buffer& b : input.buffers) sizes[b.holder] = b.bytes;
  const auto buffer = [&](planner::Holder holder) -> std::vector<uint8_t>& {
    auto [it, added] = contents.emplace(holder, std::vector<uint8_t>());
    if (added) it->second = PoisonedBuffer(sizes.at(holder), holder, poison);
    return it->second;
  };
  for (const planner::TensorLayouts& t : input.tensors) {
    const std::vector<uint8_t> values = Values(t, seed);
    const int64_t in = planner::ElementBytes(t.source_dtype), out = planner::ElementBytes(t.target_dtype);
    for (const planner::Placement& p : t.target.placements) {
      std::vector<uint8_t>& data = buffer(p.holder);
      ForEachElement(p, t.shape, [&](int64_t flat, int64_t at) {
        if (t.source_dtype == t.target_dtype) {
          std::memcpy(data.data() + at * out, values.data() + flat * in, out);
          return;
        }
        uint32_t bits;
        std::memcpy(&bits, values.data() + flat * in, 4);
        const uint16_t half = testing::Float32ToBFloat16(bits);
        std::memcpy(data.data() + at * out, &half, 2);
      });
    }
    for (const planner::Fill& f : t.target.fills) {
      std::vector<uint8_t>& data = buffer(f.holder);
      const planner::Placement as_placement{planner::FullBox(f.shape), f.holder, f.base, f.strides};
      ForEachElement(as_placement, f.shape, [&](int64_t, int64_t at) { std::memset(data.data() + at * out, 0, out); });
    }
  }
  return contents;
}

}  // namespace shardsync::e2e
