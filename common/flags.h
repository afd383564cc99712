// Flags of every main, on CLI11: "--name value" or "--name=value", and for the daemons
// --config FILE, one "name = value" per line named like the flags ("#" starts a
// comment; a bare "name" sets a switch); a flag on the command line wins over the file.
// Strict: a number is whole and decimal, inside the flag's range; a switch takes true,
// false, 1 or 0 (bare: true); an unknown name, on the command line or in the file, is
// an error. Flags are parsed in main.cc files only, into their typed configs.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/time/time.h"

namespace shardsync::flags {

// A whole decimal number (no sign unless negative values are allowed, no hex, no
// fraction).
extern const CLI::Validator kDecimal;
// true, false, 1 or 0.
extern const CLI::Validator kStrictBool;
// A finite real number above 0.
extern const CLI::Validator kPositive;
// HOST:PORT with a port in 0..65535 (0: the system chooses); HOST may be empty.
extern const CLI::Validator kAddress;

// An integer flag inside [min, max].
template <typename T>
CLI::Option* AddInt(CLI::App& app, const std::string& name, T& value, const std::string& help, T min,
                    T max = std::numeric_limits<T>::max()) {
  // Before the range: a number past the type's limits must not saturate into it.
  const CLI::Validator fits(
      [min, max](std::string& text) {
        T parsed{};
        return absl::SimpleAtoi(text, &parsed)
                   ? std::string()
                   : "takes a number in " + std::to_string(min) + ".." + std::to_string(max) + ", got '" + text + "'";
      },
      "", "fits");
  return app.add_option(name, value, help)
      ->check(kDecimal)
      ->check(fits)
      ->check(CLI::Range(min, max))
      ->capture_default_str();
}

// A duration flag given in whole milliseconds inside [min_ms, max_ms].
CLI::Option* AddMilliseconds(CLI::App& app, const std::string& name, absl::Duration& value, const std::string& help,
                             int64_t min_ms, int64_t max_ms);

// A finite real number above 0.
CLI::Option* AddPositive(CLI::App& app, const std::string& name, double& value, const std::string& help);

// A switch: bare is true, or =true|false|1|0.
CLI::Option* AddSwitch(CLI::App& app, const std::string& name, bool& value, const std::string& help);

// A HOST:PORT flag (kAddress).
CLI::Option* AddAddress(CLI::App& app, const std::string& name, std::string& value, const std::string& help);
// A coordinator's address: HOST:PORT, or unix:PATH (an agent that serves the coordinator
// on its unix socket; no TLS there).
CLI::Option* AddCoordinatorAddress(CLI::App& app, const std::string& name, std::string& value, const std::string& help);

// --log-level: trace, debug, info, warn or error.
CLI::Option* AddLogLevel(CLI::App& app, std::string& level);

// --config FILE, as above.
void AddConfigFile(CLI::App& app);

// Parses argv. --help prints the help to stdout and returns 0; a usage error prints
// "program: error" and a hint to stderr and returns 2; otherwise returns -1 (go on).
int Parse(CLI::App& app, int argc, char** argv);

// A usage error found after parsing (flags that exclude each other, say): printed as
// Parse prints its own; returns 2.
int UsageError(const CLI::App& app, const std::string& error);

}  // namespace shardsync::flags
