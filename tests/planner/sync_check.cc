#include "tests/planner/sync_check.h"

#include <cstring>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "planner/box.h"

namespace shardsync::testing {
namespace {

using planner::ElementBytes;
using planner::Index;

// Calls fn(i) for every multi-index i of `extent`, row-major.
void ForEachIndex(const Index& extent, const std::function<void(const Index&)>& fn) {
  if (planner::NumElements(extent) == 0) return;
  Index i(extent.size(), 0);
  while (true) {
    fn(i);
    int k = static_cast<int>(extent.size()) - 1;
    while (k >= 0 && ++i[k] == extent[k]) i[k--] = 0;
    if (k < 0) return;
  }
}

int64_t Offset(int64_t base, const Index& i, const Index& strides) {
  for (size_t k = 0; k < i.size(); ++k) base += i[k] * strides[k];
  return base;
}

// (flat tensor index, buffer element offset) of every element of a placement.
void ForEachElement(const planner::Placement& p, const Index& tensor_strides,
                    const std::function<void(int64_t, int64_t)>& fn) {
  ForEachIndex(planner::Extent(p.box), [&](const Index& i) {
    int64_t flat = 0;
    for (size_t k = 0; k < i.size(); ++k) flat += (p.box.lo[k] + i[k]) * tensor_strides[k];
    fn(flat, Offset(p.base, i, p.strides));
  });
}

}  // namespace

TensorValues PrepareBuffers(const planner::PlanInput& input, std::mt19937_64& rng, HostBuffers& buffers) {
  for (auto& [holder, bytes] : buffers) {
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  }
  TensorValues values;
  for (const planner::TensorLayouts& t : input.tensors) {
    std::vector<uint8_t> v(planner::NumElements(t.shape) * ElementBytes(t.source_dtype));
    for (uint8_t& b : v) b = static_cast<uint8_t>(rng() | 1);  // odd bytes: never zero
    values.push_back(std::move(v));
  }
  WriteSources(input, values, buffers);
  return values;
}

void WriteSources(const planner::PlanInput& input, const TensorValues& values, HostBuffers& buffers) {
  for (size_t ti = 0; ti < input.tensors.size(); ++ti) {
    const planner::TensorLayouts& t = input.tensors[ti];
    const int64_t element = ElementBytes(t.source_dtype);
    const Index strides = planner::ContiguousStrides(t.shape);
    for (const planner::Placement& p : t.source.placements) {
      std::vector<uint8_t>& buffer = buffers.at(p.holder);
      ForEachElement(p, strides, [&](int64_t flat, int64_t at) {
        std::memcpy(buffer.data() + at * element, values[ti].data() + flat * element, element);
      });
    }
  }
}

std::vector<std::string> CheckSync(const planner::PlanInput& input, const TensorValues& values,
                                   const HostBuffers& before, const HostBuffers& after) {
  std::vector<std::string> errors;
  auto report = [&](std::string what) {
    if (errors.size() < 5) errors.push_back(std::move(what));
  };
  std::map<planner::Holder, std::vector<bool>> written;
  for (const auto& [holder, bytes] : after) written[holder].assign(bytes.size(), false);
  for (size_t ti = 0; ti < input.tensors.size(); ++ti) {
    const planner::TensorLayouts& t = input.tensors[ti];
    const int64_t in = ElementBytes(t.source_dtype), out = ElementBytes(t.target_dtype);
    const Index strides = planner::ContiguousStrides(t.shape);
    for (const planner::Placement& p : t.target.placements) {
      const std::vector<uint8_t>& buffer = after.at(p.holder);
      ForEachElement(p, strides, [&](int64_t flat, int64_t at) {
        uint8_t expected[8];
        if (t.source_dtype == t.target_dtype) {
          std::memcpy(expected, values[ti].data() + flat * in, out);
        } else {
          uint32_t bits;
          std::memcpy(&bits, values[ti].data() + flat * in, 4);
          const uint16_t half = Float32ToBFloat16(bits);
          std::memcpy(expected, &half, 2);
        }
        if (std::memcmp(buffer.data() + at * out, expected, out) != 0) {
          report(absl::StrCat("tensor '", t.name, "' element ", flat, " on rank ", p.holder.rank, " differs"));
        }
        for (int64_t b = 0; b < out; ++b) written[p.holder][at * out + b] = true;
      });
    }
    for (const planner::Fill& f : t.target.fills) {
      const std::vector<uint8_t>& buffer = after.at(f.holder);
      ForEachIndex(f.shape, [&](const Index& i) {
        const int64_t at = Offset(f.base, i, f.strides);
        for (int64_t b = 0; b < out; ++b) {
          if (buffer[at * out + b] != 0) report(absl::StrCat("tensor '", t.name, "' pad element not zero"));
          written[f.holder][at * out + b] = true;
        }
      });
    }
  }
  for (const auto& [holder, bytes] : after) {
    const std::vector<uint8_t>& old = before.at(holder);
    const std::vector<bool>& mask = written[holder];
    for (size_t b = 0; b < bytes.size(); ++b) {
      if (!mask[b] && bytes[b] != old[b]) {
        report(absl::StrCat("byte ", b, " of buffer ", holder.buffer, " on rank ", holder.rank,
                            " changed but no target placement covers it"));
        break;
      }
    }
  }
  return errors;
}

}  // namespace shardsync::testing
