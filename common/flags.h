// Command-line flags for main.cc files: "--name value", "--name=value" and bare
// "--switch", and a config file of the same names. Each main takes the flags it knows
// into its typed config; anything left over is an error.
#pragma once

#include <cstdlib>
#include <map>
#include <optional>
#include <string>

namespace shardsync {

class Flags {
 public:
  // Parses argv[first..argc).
  Flags(int argc, char** argv, int first);

  const std::string& error() const { return error_; }
  // Adds the settings of a config file: one "name = value" per line (a bare "name" is a
  // switch), names as the flags have them without "--", "#" starts a comment. A flag
  // given on the command line wins over the file.
  bool MergeConfigFile(const std::string& path);
  std::string Take(const std::string& name, const std::string& fallback);
  bool TakeSwitch(const std::string& name);
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
  // The first flag nobody took, as an error message; empty when all were taken.
  std::string Leftover() const;

 private:
  std::optional<std::string> TakeRaw(const std::string& name);
  std::map<std::string, std::string> values_;
  std::string error_;
};

}  // namespace shardsync
