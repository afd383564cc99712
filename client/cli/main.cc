// shardsyncctl: the operator's command line. Flags are parsed here only, into one
// typed config per command.
//   shardsyncctl plan [--spec FILE | --model NAME ...] [--json]
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>

#include "client/cli/plan_command.h"
#include "planner/models.h"

namespace {

constexpr char kUsage[] = R"(usage: shardsyncctl COMMAND [FLAGS]

Commands:
  plan      Plan a layout without moving data; print bytes per rank and the cost floor.

Exit codes: 0 ok, 2 usage error, 3 refused (bad layout or input).
Run `shardsyncctl COMMAND --help` for a command's flags.
)";

constexpr char kPlanHelp[] = R"(usage: shardsyncctl plan (--spec FILE | --model NAME [model flags]) [FLAGS]

Plans every tensor of a layout once, as the coordinator would, and prints per rank the
bytes sent, received, copied locally and zero-filled, the segments, chunks and rounds,
the plan digest and the cost floor. Nothing is moved.

Layout (one of):
  --spec FILE           a layout spec: JSON of shardsync.v1.LayoutSpec (docs/layout-spec.md)
  --model NAME          a preset model: qwen3-0.6b, qwen3-1.7b, qwen3-8b
Model flags (with --model):
  --zero N              trainer ZeRO stage: 1, 2 or 3 (default 3)
  --dp N                trainer DP ranks 0..N-1 (default 8)
  --tp N                rollout TP size of each replica (default 4)
  --replicas N          rollout replicas on ranks 0..tp*replicas-1 (default 2)
  --fused               rollout holds fused qkv and gate_up shards
Flags:
  --staging-bytes B     staging budget per peer per direction, bytes (default 67108864)
  --link-gbps X         link speed for the floor, GB/s one direction per rank (default 360)
  --memory-gbps X       device memory speed for the floor, GB/s read + write (default 4200)
  --policy P            replica policy: least_loaded (default) or first_holder
  --json                one JSON object instead of tables
)";

// "--name value" or "--name=value" flags and bare "--switch" flags.
class Flags {
 public:
  Flags(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
      std::string arg = argv[i];
      if (arg.rfind("--", 0) != 0) {
        error_ = "unexpected argument '" + arg + "'";
        return;
      }
      const size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        values_[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
      } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        values_[arg.substr(2)] = argv[++i];
      } else {
        values_[arg.substr(2)] = "";
      }
    }
  }
  const std::string& error() const { return error_; }
  bool Has(const std::string& name) const { return values_.count(name) > 0; }

  std::string Take(const std::string& name, const std::string& fallback) { return TakeRaw(name).value_or(fallback); }
  bool TakeSwitch(const std::string& name) { return TakeRaw(name).has_value(); }
  template <typename T>
  T TakeNumber(const std::string& name, T fallback) {
    const std::optional<std::string> raw = TakeRaw(name);
    if (!raw) return fallback;
    char* end = nullptr;
    const double value = std::strtod(raw->c_str(), &end);
    if (raw->empty() || *end != '\0') {
      error_ = "--" + name + " needs a number, got '" + *raw + "'";
      return fallback;
    }
    return static_cast<T>(value);
  }
  // Any flag left over was not understood.
  std::string Leftover() const { return values_.empty() ? "" : "unknown flag --" + values_.begin()->first; }

 private:
  std::optional<std::string> TakeRaw(const std::string& name) {
    auto it = values_.find(name);
    if (it == values_.end()) return std::nullopt;
    std::string value = it->second;
    values_.erase(it);
    return value;
  }
  std::map<std::string, std::string> values_;
  std::string error_;
};

int Usage(const std::string& error, const char* help) {
  std::cerr << "shardsyncctl: " << error << "\n\n" << help;
  return 2;
}

int Plan(Flags& flags) {
  if (flags.TakeSwitch("help")) {
    std::cout << kPlanHelp;
    return 0;
  }
  shardsync::cli::PlanCommandConfig config;
  config.spec_path = flags.Take("spec", "");
  config.model = flags.Take("model", "");
  config.fused = flags.TakeSwitch("fused");
  config.zero_stage = flags.TakeNumber("zero", config.zero_stage);
  config.dp = flags.TakeNumber("dp", config.dp);
  config.tp = flags.TakeNumber("tp", config.tp);
  config.replicas = flags.TakeNumber("replicas", config.replicas);
  config.staging_bytes = flags.TakeNumber("staging-bytes", config.staging_bytes);
  config.link_gbps = flags.TakeNumber("link-gbps", config.link_gbps);
  config.memory_gbps = flags.TakeNumber("memory-gbps", config.memory_gbps);
  config.policy = flags.Take("policy", config.policy);
  config.json = flags.TakeSwitch("json");
  if (!flags.error().empty()) return Usage(flags.error(), kPlanHelp);
  if (!flags.Leftover().empty()) return Usage(flags.Leftover(), kPlanHelp);
  if (config.spec_path.empty() == config.model.empty()) return Usage("give exactly one of --spec and --model", kPlanHelp);
  if (config.policy != "least_loaded" && config.policy != "first_holder") {
    return Usage("--policy must be least_loaded or first_holder", kPlanHelp);
  }
  if (config.dp < 1 || config.tp < 1 || config.replicas < 1 || config.link_gbps <= 0 || config.memory_gbps <= 0) {
    return Usage("--dp, --tp, --replicas and the speeds must be positive", kPlanHelp);
  }
  return shardsync::cli::RunPlanCommand(config, std::cout, std::cerr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  Flags flags(argc, argv, 2);
  if (!flags.error().empty()) return Usage(flags.error(), kUsage);
  if (command == "plan") return Plan(flags);
  return Usage("unknown command '" + command + "'", kUsage);
}
