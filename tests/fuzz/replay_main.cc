// Runs a fuzz target over files, as libFuzzer would replay them: every file of every
// folder given, once. Built with g++ for `bazel test`, where libFuzzer is not linked;
// tests/fuzz/run does the fuzzing itself with clang.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  int inputs = 0;
  for (int i = 1; i < argc; ++i) {
    for (const auto& entry : std::filesystem::directory_iterator(argv[i])) {
      std::ifstream file(entry.path(), std::ios::binary);
      const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
      ++inputs;
    }
  }
  std::printf("replayed %d inputs without a finding\n", inputs);
  return inputs > 0 ? 0 : 1;  // an empty corpus proves nothing
}
