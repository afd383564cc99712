// Delta encoding on the CPU (what a CPU agent would run per chunk): encode and apply
// throughput in GB/s of shard, beside one memcpy of the same bytes (a pass over the
// memory: the floor of any diff that reads two copies) and the encoded size against the
// shard's. Cases: change fractions of 16-bit words from 0 to 100%. One JSON line each.
//   delta_bench [--megabytes N] [--repeats N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "common/flags.h"
#include "executor/delta_codec.h"

namespace {

using namespace shardsync;

// Median seconds of `repeats` runs of `run`.
double Timed(int repeats, const std::function<void()>& run) {
  std::vector<double> seconds;
  for (int k = 0; k < repeats; ++k) {
    const auto start = std::chrono::steady_clock::now();
    run();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t megabytes = 256;
  int repeats = 5;
  CLI::App app{"Delta encoding on the CPU: throughput against a memcpy, and size", "delta_bench"};
  flags::AddInt(app, "--megabytes", megabytes, "shard size, MiB", int64_t{1}, int64_t{1} << 16);
  flags::AddInt(app, "--repeats", repeats, "runs per case (the median is printed)", 1, 1000);
  if (const int code = flags::Parse(app, argc, argv); code >= 0) return code;
  const int64_t bytes = megabytes << 20;
  std::mt19937_64 rng(1);
  std::vector<uint8_t> baseline(bytes);
  for (int64_t k = 0; k < bytes; k += 8) {
    const uint64_t word = rng();
    std::memcpy(&baseline[k], &word, std::min<int64_t>(8, bytes - k));
  }
  std::vector<uint8_t> copy(bytes);
  const double memcpy_seconds = Timed(repeats, [&] { std::memcpy(copy.data(), baseline.data(), bytes); });
  for (double fraction : {0.0, 0.001, 0.01, 0.1, 0.5, 1.0}) {
    std::vector<uint8_t> current = baseline;
    std::bernoulli_distribution pick(fraction);
    for (int64_t k = 0; k < bytes; k += 2) {
      if (pick(rng)) current[k] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
    std::string encoded;
    encoded.reserve(bytes + bytes / executor::kDeltaBlockBytes + 1);
    executor::DeltaCounts counts;
    const double encode_seconds = Timed(repeats, [&] {
      encoded.clear();
      counts = executor::EncodeDelta(current.data(), baseline.data(), bytes, encoded);
    });
    // Applying writes absolute values: a second application does the first's work again.
    std::memcpy(copy.data(), baseline.data(), bytes);
    const double apply_seconds = Timed(repeats, [&] {
      if (!executor::ApplyDelta(reinterpret_cast<const uint8_t*>(encoded.data()), static_cast<int64_t>(encoded.size()),
                                copy.data(), bytes)
               .ok()) {
        std::exit(1);
      }
    });
    if (copy != current) {
      std::fprintf(stderr, "applied bytes differ at fraction %g\n", fraction);
      return 1;
    }
    std::printf(
        "{\"changed\": %g, \"shard_mib\": %lld, \"encoded_over_shard\": %.5f, \"encode_gbps\": %.2f, "
        "\"apply_gbps\": %.2f, \"memcpy_gbps\": %.2f}\n",
        static_cast<double>(counts.changed_words) / (bytes / 2), static_cast<long long>(megabytes),
        static_cast<double>(counts.encoded_bytes) / bytes, bytes / encode_seconds / 1e9, bytes / apply_seconds / 1e9,
        bytes / memcpy_seconds / 1e9);
  }
  return 0;
}
