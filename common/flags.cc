#include "common/flags.h"

namespace shardsync {

Flags::Flags(int argc, char** argv, int first) {
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
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

std::string Flags::Take(const std::string& name, const std::string& fallback) {
  return TakeRaw(name).value_or(fallback);
}

bool Flags::TakeSwitch(const std::string& name) { return TakeRaw(name).has_value(); }

std::string Flags::Leftover() const {
  return values_.empty() ? "" : "unknown flag --" + values_.begin()->first;
}

std::optional<std::string> Flags::TakeRaw(const std::string& name) {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  std::string value = it->second;
  values_.erase(it);
  return value;
}

}  // namespace shardsync
