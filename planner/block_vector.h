// A growable array in fixed blocks: growing never copies what is stored and touches
// only the memory it fills. A plan of tens of millions of segments in one std::vector
// would touch about twice its size while it doubles (every old buffer, then the new one).
#pragma once

#include <cstddef>
#include <initializer_list>
#include <iterator>
#include <type_traits>
#include <utility>
#include <vector>

namespace shardsync::planner {

template <typename T>
class BlockVector {
 public:
  static constexpr size_t kBlockBits = 14;  // 16 Ki elements a block
  static constexpr size_t kBlockSize = size_t{1} << kBlockBits;

  template <bool kConst>
  class Iterator {
   public:
    using iterator_category = std::random_access_iterator_tag;
    using value_type = T;
    using difference_type = std::ptrdiff_t;
    using pointer = std::conditional_t<kConst, const T*, T*>;
    using reference = std::conditional_t<kConst, const T&, T&>;
    using Owner = std::conditional_t<kConst, const BlockVector, BlockVector>;

    Iterator() = default;
    Iterator(Owner* owner, size_t index) : owner_(owner), index_(index) {}
    reference operator*() const { return (*owner_)[index_]; }
    pointer operator->() const { return &(*owner_)[index_]; }
    reference operator[](difference_type n) const { return (*owner_)[index_ + n]; }
    Iterator& operator++() { return ++index_, *this; }
    Iterator operator++(int) { return Iterator(owner_, index_++); }
    Iterator& operator--() { return --index_, *this; }
    Iterator operator--(int) { return Iterator(owner_, index_--); }
    Iterator& operator+=(difference_type n) { return index_ += n, *this; }
    Iterator& operator-=(difference_type n) { return index_ -= n, *this; }
    friend Iterator operator+(Iterator it, difference_type n) { return it += n; }
    friend Iterator operator+(difference_type n, Iterator it) { return it += n; }
    friend Iterator operator-(Iterator it, difference_type n) { return it -= n; }
    friend difference_type operator-(Iterator a, Iterator b) {
      return static_cast<difference_type>(a.index_) - static_cast<difference_type>(b.index_);
    }
    friend bool operator==(Iterator a, Iterator b) { return a.index_ == b.index_; }
    friend bool operator!=(Iterator a, Iterator b) { return a.index_ != b.index_; }
    friend bool operator<(Iterator a, Iterator b) { return a.index_ < b.index_; }
    friend bool operator>(Iterator a, Iterator b) { return a.index_ > b.index_; }
    friend bool operator<=(Iterator a, Iterator b) { return a.index_ <= b.index_; }
    friend bool operator>=(Iterator a, Iterator b) { return a.index_ >= b.index_; }

   private:
    Owner* owner_ = nullptr;
    size_t index_ = 0;
  };
  using iterator = Iterator<false>;
  using const_iterator = Iterator<true>;
  using value_type = T;

  BlockVector() = default;
  BlockVector(std::initializer_list<T> values) {
    for (const T& v : values) push_back(v);
  }
  // A copy keeps every block's full reservation (a plain vector copy would not).
  BlockVector(const BlockVector& other) {
    for (const T& v : other) push_back(v);
  }
  BlockVector& operator=(const BlockVector& other) {
    if (this != &other) {
      clear();
      for (const T& v : other) push_back(v);
    }
    return *this;
  }
  BlockVector(BlockVector&&) noexcept = default;
  BlockVector& operator=(BlockVector&&) noexcept = default;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](size_t i) { return blocks_[i >> kBlockBits][i & (kBlockSize - 1)]; }
  const T& operator[](size_t i) const { return blocks_[i >> kBlockBits][i & (kBlockSize - 1)]; }
  T& back() { return (*this)[size_ - 1]; }
  const T& back() const { return (*this)[size_ - 1]; }

  template <typename... Args>
  T& emplace_back(Args&&... args) {
    if ((size_ & (kBlockSize - 1)) == 0) {
      blocks_.emplace_back();
      blocks_.back().reserve(kBlockSize);  // never grows past it, so never moves
    }
    ++size_;
    return blocks_.back().emplace_back(std::forward<Args>(args)...);
  }
  void push_back(const T& value) { emplace_back(value); }

  // Shrinking frees the blocks past the new end; growing appends default values.
  void resize(size_t n) {
    if (n < size_) {
      blocks_.resize((n + kBlockSize - 1) >> kBlockBits);
      if (!blocks_.empty()) blocks_.back().resize(n - ((blocks_.size() - 1) << kBlockBits));
      size_ = n;
    }
    while (size_ < n) emplace_back();
  }
  void clear() { resize(0); }

  iterator begin() { return iterator(this, 0); }
  iterator end() { return iterator(this, size_); }
  const_iterator begin() const { return const_iterator(this, 0); }
  const_iterator end() const { return const_iterator(this, size_); }

  // Calls f with each block's elements as one contiguous run, in order.
  template <typename F>
  void ForEachBlock(F&& f) const {
    for (const std::vector<T>& block : blocks_) f(static_cast<const std::vector<T>&>(block));
  }

  friend bool operator==(const BlockVector& a, const BlockVector& b) { return a.blocks_ == b.blocks_; }
  friend bool operator!=(const BlockVector& a, const BlockVector& b) { return !(a == b); }

 private:
  std::vector<std::vector<T>> blocks_;
  size_t size_ = 0;
};

}  // namespace shardsync::planner
