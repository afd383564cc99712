// The metrics endpoint under idle connections: a MetricsServer in this process, N
// connections opened and left silent, then scrapes timed from connect to the last byte.
// Prints one JSON line: median and p99 milliseconds, with and without the idle ones.
//   bazel run -c opt //bench:metrics_scrape_bench -- [--idle 100] [--scrapes 200]
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/flags.h"
#include "common/metrics_http.h"
#include "tools/localsync/http_get.h"

namespace {

// Milliseconds of each of `count` scrapes of `port`, sorted; empty when one fails.
std::vector<double> TimeScrapes(int port, int count) {
  std::vector<double> ms;
  for (int i = 0; i < count; ++i) {
    const absl::Time start = absl::Now();
    if (shardsync::localsync::HttpGet(port, "/metrics").rfind("HTTP/1.0 200", 0) != 0) return {};
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  std::sort(ms.begin(), ms.end());
  return ms;
}

double At(const std::vector<double>& sorted, double quantile) {
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(quantile * static_cast<double>(sorted.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  int idle = 100;
  int scrapes = 200;
  CLI::App app("Scrape latency of the metrics endpoint, alone and beside idle connections.", "metrics_scrape_bench");
  shardsync::flags::AddInt(app, "--idle", idle, "connections opened and left silent", 0, 1000);
  shardsync::flags::AddInt(app, "--scrapes", scrapes, "scrapes timed in each case", 1, 100000);
  if (const int code = shardsync::flags::Parse(app, argc, argv); code >= 0) return code;
  const std::string body(16 << 10, '#');  // about a daemon's page
  auto server = shardsync::MetricsServer::Start("127.0.0.1:0", [&] { return body; });
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  const int port = (*server)->port();
  const std::vector<double> alone = TimeScrapes(port, scrapes);
  std::vector<int> silent;
  for (int i = 0; i < idle; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) silent.push_back(fd);
  }
  const std::vector<double> beside = TimeScrapes(port, scrapes);
  for (int fd : silent) close(fd);
  if (alone.empty() || beside.empty()) {
    std::fprintf(stderr, "a scrape failed\n");
    return 1;
  }
  std::printf(
      "{\"idle\": %d, \"scrapes\": %d, \"alone_median_ms\": %.3f, \"alone_p99_ms\": %.3f, "
      "\"beside_idle_median_ms\": %.3f, \"beside_idle_p99_ms\": %.3f}\n",
      static_cast<int>(silent.size()), scrapes, At(alone, 0.5), At(alone, 0.99), At(beside, 0.5), At(beside, 0.99));
  return 0;
}
