#include "common/flags.h"

#include <cmath>
#include <cstdio>
#include <map>

namespace shardsync::flags {
namespace {

bool AllDigits(const std::string& text, size_t from) {
  if (text.size() <= from) return false;
  for (size_t i = from; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
  }
  return true;
}

// A decimal number as CLI11 converts it (strtoll with base 0): digits, no leading zero
// (which would make it octal) unless it is 0, a sign only before a non-zero number.
bool IsDecimal(const std::string& text) {
  const size_t digits = text.rfind('-', 0) == 0 ? 1 : 0;
  if (!AllDigits(text, digits)) return false;
  return text.size() == digits + 1 ? !(digits == 1 && text[1] == '0') : text[digits] != '0';
}

std::string Trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

// The --config format: one "name = value" per line, "#" to the end of a line a comment,
// a bare "name" a switch set to true. A section, an empty value or a name that is no
// flag's is an error; a value is the whole rest of its line (spaces, brackets and
// commas included).
class ConfigFile : public CLI::Config {
 public:
  std::string to_config(const CLI::App*, bool, bool, std::string) const override { return ""; }
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    std::vector<CLI::ConfigItem> items;
    std::string line;
    std::map<std::string, int> first_line;  // of each name: a name given twice is an error
    for (int number = 1; std::getline(input, line); ++number) {
      line = Trim(line.substr(0, line.find('#')));
      if (line.empty()) continue;
      const size_t eq = line.find('=');
      CLI::ConfigItem item;
      item.name = Trim(line.substr(0, eq));
      const std::string value = eq == std::string::npos ? "true" : Trim(line.substr(eq + 1));
      if (item.name.empty() || item.name.find_first_of(" \t[]") != std::string::npos || item.name[0] == '-' ||
          value.empty() || value == "{}") {
        throw CLI::ConfigError("line " + std::to_string(number) + ": expected 'name = value', got '" + line + "'");
      }
      if (const auto [it, fresh] = first_line.emplace(item.name, number); !fresh) {
        throw CLI::ConfigError("line " + std::to_string(number) + ": '" + item.name + "' is set again (first on line " +
                               std::to_string(it->second) + ")");
      }
      item.inputs = {value};
      items.push_back(std::move(item));
    }
    return items;
  }
};

}  // namespace

const CLI::Validator kDecimal(
    [](std::string& text) {
      return IsDecimal(text) ? std::string() : "takes a whole decimal number, got '" + text + "'";
    },
    "", "decimal");

const CLI::Validator kStrictBool(
    [](std::string& text) {
      return text == "true" || text == "false" || text == "1" || text == "0"
                 ? std::string()
                 : "takes true, false, 1 or 0, got '" + text + "'";
    },
    "", "bool");

const CLI::Validator kAddress(
    [](std::string& text) {
      const size_t colon = text.rfind(':');
      if (colon == std::string::npos || !AllDigits(text, colon + 1) || text.size() - colon > 6 ||
          std::stoi(text.substr(colon + 1)) > 65535) {
        return "takes HOST:PORT with a port in 0..65535, got '" + text + "'";
      }
      return std::string();
    },
    "HOST:PORT", "address");

// HOST:PORT, or unix:PATH for a coordinator served on an agent's unix socket.
const CLI::Validator kCoordinatorAddress(
    [](std::string& text) {
      if (text.rfind("unix:", 0) == 0) {
        return text.size() > 5 ? std::string() : "takes unix:PATH with a path, got '" + text + "'";
      }
      std::string error = kAddress(text);
      return error.empty() ? error : "takes HOST:PORT or unix:PATH, got '" + text + "'";
    },
    "HOST:PORT|unix:PATH", "coordinator address");

const CLI::Validator kPositive(
    [](std::string& text) {
      double parsed = 0;
      return CLI::detail::lexical_cast(text, parsed) && std::isfinite(parsed) && parsed > 0
                 ? std::string()
                 : "takes a number above 0, got '" + text + "'";
    },
    "", "positive");

CLI::Option* AddMilliseconds(CLI::App& app, const std::string& name, absl::Duration& value, const std::string& help,
                             int64_t min_ms, int64_t max_ms) {
  return app
      .add_option_function<int64_t>(
          name, [&value](int64_t ms) { value = absl::Milliseconds(ms); }, help)
      ->check(kDecimal)
      ->check(CLI::Validator(
          [](std::string& text) {
            int64_t ms = 0;
            return absl::SimpleAtoi(text, &ms) ? std::string() : "takes milliseconds, got '" + text + "'";
          },
          "", "fits"))
      ->check(CLI::Range(min_ms, max_ms))
      ->default_str(std::to_string(absl::ToInt64Milliseconds(value)));
}

CLI::Option* AddPositive(CLI::App& app, const std::string& name, double& value, const std::string& help) {
  return app.add_option(name, value, help)->check(kPositive)->capture_default_str();
}

CLI::Option* AddSwitch(CLI::App& app, const std::string& name, bool& value, const std::string& help) {
  return app.add_flag(name, value, help)->check(kStrictBool);
}

CLI::Option* AddAddress(CLI::App& app, const std::string& name, std::string& value, const std::string& help) {
  return app.add_option(name, value, help)->check(kAddress)->capture_default_str();
}

CLI::Option* AddCoordinatorAddress(CLI::App& app, const std::string& name, std::string& value,
                                   const std::string& help) {
  return app.add_option(name, value, help)->check(kCoordinatorAddress)->capture_default_str();
}

CLI::Option* AddLogLevel(CLI::App& app, std::string& level) {
  return app.add_option("--log-level", level, "log level")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
}

void AddConfigFile(CLI::App& app) {
  app.set_config("--config", "",
                 "settings as 'name = value' lines, named like these flags (no '--'); a flag on "
                 "the command line wins over the file");
  app.config_formatter(std::make_shared<ConfigFile>());
  app.allow_config_extras(CLI::config_extras_mode::error);
}

int Parse(CLI::App& app, int argc, char** argv) {
  // CLI11 reads "--name=" and "--name={}" as a switch set to true: they are no value.
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos && (eq + 1 == arg.size() || arg.substr(eq + 1) == "{}")) {
      return UsageError(app, arg + " has no value");
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::ParseError& error) {
    return UsageError(app, error.what());
  }
  return -1;
}

int UsageError(const CLI::App& app, const std::string& error) {
  std::fprintf(stderr, "%s: %s\nRun with --help for the flags.\n", app.get_name().c_str(), error.c_str());
  return 2;
}

}  // namespace shardsync::flags
