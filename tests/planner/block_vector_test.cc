#include "planner/block_vector.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <random>
#include <vector>

namespace shardsync::planner {
namespace {

constexpr size_t kBlock = BlockVector<int64_t>::kBlockSize;

TEST_CASE("a block vector holds what a vector holds, across block boundaries") {
  std::mt19937_64 rng(11);
  BlockVector<int64_t> blocks;
  std::vector<int64_t> plain;
  for (size_t i = 0; i < 3 * kBlock + 17; ++i) {
    const int64_t v = static_cast<int64_t>(rng());
    blocks.push_back(v);
    plain.push_back(v);
  }
  REQUIRE(blocks.size() == plain.size());
  for (size_t i = 0; i < plain.size(); ++i) REQUIRE(blocks[i] == plain[i]);
  CHECK(std::equal(blocks.begin(), blocks.end(), plain.begin(), plain.end()));
  CHECK(blocks.end() - blocks.begin() == static_cast<std::ptrdiff_t>(plain.size()));
  CHECK(blocks.back() == plain.back());
}

TEST_CASE("growing a block vector never moves what it already holds") {
  BlockVector<int64_t> blocks;
  blocks.push_back(7);
  const int64_t* first = &blocks[0];
  for (size_t i = 1; i < 2 * kBlock + 1; ++i) blocks.emplace_back(static_cast<int64_t>(i));
  CHECK(&blocks[0] == first);
  CHECK(*first == 7);
}

TEST_CASE("resizing a block vector drops the tail or appends default values") {
  BlockVector<int64_t> blocks;
  for (size_t i = 0; i < 2 * kBlock + 5; ++i) blocks.push_back(static_cast<int64_t>(i) + 1);
  blocks.resize(kBlock + 3);
  REQUIRE(blocks.size() == kBlock + 3);
  CHECK(blocks.back() == static_cast<int64_t>(kBlock) + 3);
  blocks.resize(kBlock);  // exactly one full block
  CHECK(blocks.back() == static_cast<int64_t>(kBlock));
  blocks.resize(kBlock + 2);
  CHECK(blocks[kBlock] == 0);
  CHECK(blocks[kBlock + 1] == 0);
  blocks.push_back(42);
  CHECK(blocks.size() == kBlock + 3);
  CHECK(blocks.back() == 42);
  blocks.clear();
  CHECK(blocks.empty());
  blocks.push_back(5);
  CHECK(blocks[0] == 5);
}

TEST_CASE("a copied block vector is equal, independent, and keeps growing in place") {
  BlockVector<int64_t> blocks{3, 1, 2};
  for (size_t i = 0; i < kBlock; ++i) blocks.push_back(static_cast<int64_t>(i));
  BlockVector<int64_t> copy = blocks;
  CHECK(copy == blocks);
  copy[0] = 9;
  CHECK(blocks[0] == 3);
  CHECK(copy != blocks);
  const int64_t* last = &copy.back();
  copy.push_back(1);  // the copy's last block was reserved whole: nothing moves
  CHECK(&copy[copy.size() - 2] == last);
  std::sort(copy.begin(), copy.end());  // random-access iterators
  CHECK(std::is_sorted(copy.begin(), copy.end()));
  BlockVector<int64_t> moved = std::move(copy);
  CHECK(moved.size() == kBlock + 4);
}

}  // namespace
}  // namespace shardsync::planner
