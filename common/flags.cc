#include "common/flags.h"

#include <cstdio>

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

bool Flags::MergeConfigFile(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "r");
  if (file == nullptr) {
    error_ = "cannot read the config file '" + path + "'";
    return false;
  }
  char buffer[4096];
  int number = 0;
  while (std::fgets(buffer, sizeof(buffer), file) != nullptr) {
    ++number;
    std::string line = buffer;
    line = line.substr(0, line.find('#'));
    const auto trim = [](std::string text) {
      const size_t first = text.find_first_not_of(" \t\r\n");
      if (first == std::string::npos) return std::string();
      return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
    };
    line = trim(line);
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    const std::string name = trim(line.substr(0, eq));
    if (name.empty() || name.rfind("--", 0) == 0 || name.find(' ') != std::string::npos) {
      error_ = path + ":" + std::to_string(number) + ": expected 'name = value'";
      std::fclose(file);
      return false;
    }
    if (!values_.count(name)) values_[name] = eq == std::string::npos ? "" : trim(line.substr(eq + 1));
  }
  std::fclose(file);
  return true;
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
