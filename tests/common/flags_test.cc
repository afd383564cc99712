// The flags every main parses (common/flags.h): strict numbers, switches and addresses,
// config files that cannot turn a switch on by accident, unknown names refused.
#include "common/flags.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <string>
#include <vector>

#include "common/daemon_process.h"
#include "daemon/coordinator/coordinator_flags.h"

namespace shardsync {
namespace {

// The coordinator's own flags and those of every daemon, as its main adds them.
struct CoordinatorFlags {
  coordinator::CoordinatorConfig config;
  DaemonFlags daemon;
  CLI::App app{"test", "shardsync-coordinator"};
  CoordinatorFlags() {
    coordinator::AddCoordinatorFlags(app, config);
    AddDaemonFlags(app, daemon);
  }
  // Parse's exit code: -1 parsed, 2 a usage error.
  int Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "shardsync-coordinator");
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    return flags::Parse(app, static_cast<int>(argv.size()), argv.data());
  }
};

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST_CASE("a switch is true bare or given true or 1, false given false or 0; anything else is refused") {
  for (const auto& [args, insecure] :
       std::vector<std::pair<std::vector<std::string>, bool>>{{{"--insecure"}, true},
                                                              {{"--insecure=true"}, true},
                                                              {{"--insecure=1"}, true},
                                                              {{"--insecure=false"}, false},
                                                              {{"--insecure=0"}, false},
                                                              {{}, false}}) {
    CoordinatorFlags f;
    INFO((args.empty() ? std::string("(none)") : args[0]));
    REQUIRE(f.Parse(args) == -1);
    CHECK(f.daemon.tls.insecure == insecure);
  }
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{{"--insecure", "false"},
                                                                                    {"--insecure=no"},
                                                                                    {"--insecure=2"},
                                                                                    {"--insecure=off"},
                                                                                    {"--insecure="},
                                                                                    {"--insecure={}"}}) {
    CoordinatorFlags f;
    INFO((args[0] + (args.size() > 1 ? " " + args[1] : "")));
    CHECK(f.Parse(args) == 2);  // a usage error: the daemon stops before serving
  }
}

TEST_CASE("a config file sets flags the command line has not; insecure = false there is false") {
  CoordinatorFlags f;
  const std::string path = WriteFile("c1",
                                     "# the coordinator\nworld = 3\nstaging-bytes = 65536  # a comment\n"
                                     "insecure = false\nlog-level = warn\n");
  REQUIRE(f.Parse({"--config", path, "--world", "5"}) == -1);
  CHECK(f.config.world_size == 5);  // the command line wins
  CHECK(f.config.staging_bytes == 65536);
  CHECK_FALSE(f.daemon.tls.insecure);
  CHECK(f.daemon.log_level == "warn");

  CoordinatorFlags bare;
  REQUIRE(bare.Parse({"--config", WriteFile("c2", "world = 1\ninsecure\n")}) == -1);
  CHECK(bare.daemon.tls.insecure);

  CoordinatorFlags long_comment;  // a comment longer than any read buffer, ending in a flag's name
  REQUIRE(long_comment.Parse({"--config", WriteFile("c3", "world = 1\n#" + std::string(5000, 'x') + " insecure\n")}) ==
          -1);
  CHECK_FALSE(long_comment.daemon.tls.insecure);

  for (const char* text :
       {"world = 1\ninsecure = off\n", "world = 1\nbogus = 1\n", "world = 1x\n", "world = 1\ninsecure =\n",
        "world = 1\ninsecure = # no\n", "world = 1\ninsecure = {}\n", "[coordinator]\nworld = 1\n", "world = 010\n"}) {
    CoordinatorFlags bad;
    INFO(text);
    CHECK(bad.Parse({"--config", WriteFile("c4", text)}) == 2);
  }
  CoordinatorFlags missing;
  CHECK(missing.Parse({"--config", "/nonexistent/config"}) == 2);

  CoordinatorFlags whole_lines;  // a value is the rest of its line: brackets, spaces and all
  REQUIRE(whole_lines.Parse({"--config", WriteFile("c5",
                                                   "world = 1\nmetrics-listen = [::]:9470\n"
                                                   "tls-ca = /etc/my certs/ca.pem\n")}) == -1);
  CHECK(whole_lines.config.world_size == 1);
  CHECK(whole_lines.daemon.metrics_listen == "[::]:9470");
  CHECK(whole_lines.daemon.tls.ca_file == "/etc/my certs/ca.pem");
}

TEST_CASE("a port file is written whole, and never replaces a device or a directory") {
  const std::string path = WriteFile("port", "");
  REQUIRE(WritePortFile(path, 4321));
  std::ifstream written(path);
  int port = 0;
  written >> port;
  CHECK(port == 4321);
  // A daemon run with --port-file /dev/null once replaced it with a regular file; a FIFO
  // stands in for the device here.
  const std::string fifo = std::string(std::getenv("TEST_TMPDIR")) + "/fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_FALSE(WritePortFile(fifo, 1));
  struct stat kept {};
  REQUIRE(stat(fifo.c_str(), &kept) == 0);
  CHECK(S_ISFIFO(kept.st_mode));
  CHECK_FALSE(WritePortFile(std::getenv("TEST_TMPDIR"), 1));
}

TEST_CASE("a config file that sets a name twice is refused, whichever value comes first") {
  for (const char* text : {"world = 1\ninsecure = true\ninsecure = false\n", "world = 1\nworld = 2\ninsecure\n",
                           "insecure\nworld = 1\ninsecure = false\n"}) {
    CoordinatorFlags f;
    INFO(text);
    CHECK(f.Parse({"--config", WriteFile("twice", text)}) == 2);
  }
}

TEST_CASE("numbers are whole, decimal and in range; addresses have a real port; names are known") {
  const std::vector<std::vector<std::string>> refused = {{"--world", "1.9"},
                                                         {"--world", "0x10"},
                                                         {"--world", "010x"},
                                                         {"--world", "010"},
                                                         {"--world", "-0"},
                                                         {"--world=", "3"},
                                                         {"--world", "0"},
                                                         {"--world", "2147483647"},
                                                         {"--world", "-1"},
                                                         {"--world", ""},
                                                         {"--staging-bytes", "0.5"},
                                                         {"--staging-bytes", "8"},
                                                         {"--world", "1", "--staging-bytes", "-1"},
                                                         {"--world", "1", "--metrics-listen", ":99999"},
                                                         {"--world", "1", "--metrics-listen", "localhost"},
                                                         {"--world", "1", "--log-level", "verbose"},
                                                         {"--world", "1", "--link-gbps", "nan"},
                                                         {"--world", "1", "--link-gbps", "0"},
                                                         {"--world", "1", "--relay", "sometimes"},
                                                         {"--world", "1", "--sync-timeout-ms", "1e3"},
                                                         // past int64: refused, not saturated into range
                                                         {"--world", "1", "--staging-bytes", "99999999999999999999"},
                                                         {"--world", "1", "--scratch-bytes", "9223372036854775808"},
                                                         {"--world", "1", "--sync-timeout-ms", "9223372036854775808"},
                                                         {"--world", "1", "--keepalive-ms", "99999999999999999999"},
                                                         {"--world", "1", "--bogus", "1"},
                                                         {"--world", "1", "stray"}};
  for (const std::vector<std::string>& args : refused) {
    CoordinatorFlags f;
    std::string joined;
    for (const std::string& a : args) joined += a + " ";
    INFO(joined);
    CHECK(f.Parse(args) == 2);
  }
  CoordinatorFlags f;
  REQUIRE(f.Parse({"--world", "16", "--staging-bytes", std::to_string(planner::kMinStagingBytes), "--metrics-listen",
                   "0.0.0.0:0", "--link-gbps", "100.5", "--relay", "never", "--sync-timeout-ms", "8000"}) == -1);
  CHECK(f.config.world_size == 16);
  CHECK(f.config.staging_bytes == planner::kMinStagingBytes);
  CHECK(f.daemon.metrics_listen == "0.0.0.0:0");
  CHECK(f.config.bandwidths.link_bytes_per_s == 100.5e9);
  CHECK(f.config.relay == planner::RelayMode::kNever);
  CHECK(f.config.sync_timeout == absl::Seconds(8));
}

TEST_CASE("--help prints every flag and exits 0") {
  CoordinatorFlags f;
  CHECK(f.Parse({"--help"}) == 0);
  const std::string help = f.app.help();
  for (const char* name : {"--world", "--staging-bytes", "--insecure", "--tls-ca", "--config", "--metrics-listen"}) {
    CHECK_THAT(help, Catch::Matchers::Contains(name));
  }
}

}  // namespace
}  // namespace shardsync
