// Prometheus text metrics over plain HTTP: GET /metrics answers what `render` returns
// at that moment; anything else is 404. One thread; each connection answered and closed.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace shardsync {

class MetricsServer {
 public:
  // Listens on host:port (port 0: the OS chooses). Returns the server, serving.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              std::function<std::string()> render);
  ~MetricsServer();
  int port() const { return port_; }

 private:
  MetricsServer(int fd, int port, std::function<std::string()> render);
  void Serve();

  int fd_;
  int port_;
  std::function<std::string()> render_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// What a daemon's main does with --metrics-listen and --metrics-port-file: nothing when
// `address` is empty, else a started server whose port is written to `port_file` (if
// given).
absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsIfAsked(const std::string& address,
                                                                   const std::string& port_file,
                                                                   std::function<std::string()> render);

// Prometheus text format, one metric family at a time.
void AppendMetric(std::string* out, const std::string& name, const char* type, const std::string& help, double value);

// A histogram with fixed upper bounds (seconds or any unit), rendered cumulatively.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void Observe(double value);
  void Append(std::string* out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, the last one +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

}  // namespace shardsync
