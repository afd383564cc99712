#include "common/metrics_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/daemon_process.h"

namespace shardsync {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    std::function<std::string()> render) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos)
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", address, "' has no port"));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(address.substr(colon + 1).c_str())));
  const std::string host = address.substr(0, colon);
  if (inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &addr.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", address, "': not an IPv4 address"));
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
    const int error = errno;
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat("metrics on ", address, ": ", std::strerror(error)));
  }
  socklen_t length = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  return std::unique_ptr<MetricsServer>(new MetricsServer(fd, ntohs(addr.sin_port), std::move(render)));
}

MetricsServer::MetricsServer(int fd, int port, std::function<std::string()> render)
    : fd_(fd), port_(port), render_(std::move(render)), thread_([this] { Serve(); }) {}

MetricsServer::~MetricsServer() {
  stop_ = true;
  thread_.join();
  close(fd_);
}

namespace {

// A connection waits at most this long for its request line; beyond kMaxPending waiting
// at once the oldest is closed: idle connections cannot starve a scraper, which sends its
// request as it connects.
constexpr absl::Duration kRequestDeadline = absl::Seconds(1);
constexpr size_t kMaxPending = 64;

std::string Response(const char* request, const std::function<std::string()>& render) {
  if (std::strncmp(request, "GET /metrics", 12) != 0) {
    return "HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  }
  const std::string body = render();
  return absl::StrCat("HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n\r\n", body);
}

// Writes `response`, waiting at most kRequestDeadline for the peer to take it.
void Send(int client, const std::string& response) {
  const absl::Time deadline = absl::Now() + kRequestDeadline;
  for (size_t sent = 0; sent < response.size() && absl::Now() < deadline;) {
    pollfd writable{client, POLLOUT, 0};
    if (poll(&writable, 1, static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now())) + 1) <= 0) return;
    const ssize_t n = send(client, response.data() + sent, response.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0 && errno != EAGAIN) return;
    if (n > 0) sent += static_cast<size_t>(n);
  }
}

}  // namespace

void MetricsServer::Serve() {
  struct Pending {
    int fd;
    absl::Time deadline;
  };
  std::vector<Pending> pending;
  while (!stop_) {
    std::vector<pollfd> watched{{fd_, POLLIN, 0}};
    for (const Pending& p : pending) watched.push_back({p.fd, POLLIN, 0});
    poll(watched.data(), watched.size(), 100);
    // Answer, or drop at its deadline, every connection that waited.
    std::vector<Pending> still;
    for (size_t i = 0; i < pending.size(); ++i) {
      const Pending& p = pending[i];
      if (watched[i + 1].revents != 0) {
        char request[1024] = {};
        if (read(p.fd, request, sizeof(request) - 1) > 0) Send(p.fd, Response(request, render_));
        close(p.fd);
      } else if (absl::Now() >= p.deadline) {
        close(p.fd);
      } else {
        still.push_back(p);
      }
    }
    pending.swap(still);
    if (watched[0].revents & POLLIN) {
      const int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (client < 0) continue;
      if (pending.size() >= kMaxPending) {
        close(pending.front().fd);
        pending.erase(pending.begin());
      }
      pending.push_back({client, absl::Now() + kRequestDeadline});
    }
  }
  for (const Pending& p : pending) close(p.fd);
}

absl::StatusOr<std::unique_ptr<MetricsServer>> StartMetricsIfAsked(const std::string& address,
                                                                   const std::string& port_file,
                                                                   std::function<std::string()> render) {
  if (address.empty()) return std::unique_ptr<MetricsServer>();
  auto server = MetricsServer::Start(address, std::move(render));
  if (!server.ok() || port_file.empty()) return server;
  if (!WritePortFile(port_file, (*server)->port())) {
    return absl::UnavailableError(absl::StrCat("cannot write the metrics port file ", port_file));
  }
  return server;
}

void AppendMetric(std::string* out, const std::string& name, const char* type, const std::string& help, double value) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name, " ", value, "\n");
}

void Histogram::Observe(double value) {
  size_t bucket = 0;
  while (bucket < bounds_.size() && value > bounds_[bucket]) ++bucket;
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::Append(std::string* out, const std::string& name, const std::string& help) const {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " histogram\n");
  int64_t cumulative = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? absl::StrCat(bounds_[i]) : "+Inf";
    absl::StrAppend(out, name, "_bucket{le=\"", le, "\"} ", cumulative, "\n");
  }
  absl::StrAppend(out, name, "_sum ", sum_, "\n", name, "_count ", count_, "\n");
}

}  // namespace shardsync
