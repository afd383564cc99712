#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "common/flags.h"

namespace shardsync {
namespace {

struct Args {
  std::vector<std::string> text;
  std::vector<char*> argv;
  explicit Args(std::vector<std::string> a) : text(std::move(a)) {
    for (std::string& t : text) argv.push_back(t.data());
  }
  int argc() { return static_cast<int>(argv.size()); }
};

std::string WriteFile(const std::string& text) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/config";
  std::ofstream(path) << text;
  return path;
}

TEST_CASE("a config file gives defaults the command line overrides; unknown names are left over") {
  const std::string path = WriteFile("# the agent\nrank = 3\nsocket=/run/a.sock  # comment\n\nverbose\nbogus = 1\n");
  Args args({"prog", "--rank", "5", "--config", path});
  Flags flags(args.argc(), args.argv.data(), 1);
  REQUIRE(flags.MergeConfigFile(flags.Take("config", "")));
  CHECK(flags.TakeNumber("rank", 0) == 5);  // the command line wins
  CHECK(flags.Take("socket", "") == "/run/a.sock");
  CHECK(flags.TakeSwitch("verbose"));
  CHECK(flags.Leftover() == "unknown flag --bogus");
}

TEST_CASE("a malformed config line or a missing file is an error naming it") {
  Args args({"prog"});
  Flags flags(args.argc(), args.argv.data(), 1);
  CHECK_FALSE(flags.MergeConfigFile(WriteFile("--rank = 3\n")));
  CHECK(flags.error().find(":1: expected 'name = value'") != std::string::npos);
  Flags missing(args.argc(), args.argv.data(), 1);
  CHECK_FALSE(missing.MergeConfigFile("/nonexistent/config"));
  CHECK(missing.error().find("/nonexistent/config") != std::string::npos);
}

}  // namespace
}  // namespace shardsync
