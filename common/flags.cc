#include "common/flags.h"

#include <cmath>
#include <cstdio>

namespace shardsync::flags {
namespace {

bool AllDigits(const std::string& text, size_t from) {
  if (text.size() <= from) return false;
  for (size_t i = from; i < text.size(); ++i) {
    if (text[i] < '0' || text[i] > '9') return false;
  }
  return true;
}

}  // namespace

const CLI::Validator kDecimal(
    [](std::string& text) {
      return AllDigits(text, text.rfind('-', 0) == 0 ? 1 : 0) ? std::string() : "takes a whole decimal number, got '" + text + "'";
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

const CLI::Validator kPositive(
    [](std::string& text) {
      double parsed = 0;
      return CLI::detail::lexical_cast(text, parsed) && std::isfinite(parsed) && parsed > 0
                 ? std::string()
                 : "takes a number above 0, got '" + text + "'";
    },
    "", "positive");

CLI::Option* AddPositive(CLI::App& app, const std::string& name, double& value, const std::string& help) {
  return app.add_option(name, value, help)->check(kPositive)->capture_default_str();
}

CLI::Option* AddSwitch(CLI::App& app, const std::string& name, bool& value, const std::string& help) {
  return app.add_flag(name, value, help)->check(kStrictBool);
}

CLI::Option* AddAddress(CLI::App& app, const std::string& name, std::string& value, const std::string& help) {
  return app.add_option(name, value, help)->check(kAddress)->capture_default_str();
}

CLI::Option* AddLogLevel(CLI::App& app, std::string& level) {
  return app.add_option("--log-level", level, "log level")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
}

void AddConfigFile(CLI::App& app) {
  app.set_config("--config", "", "settings as 'name = value' lines, named like these flags (no '--'); a flag on "
                                 "the command line wins over the file");
  app.allow_config_extras(CLI::config_extras_mode::error);
}

int Parse(CLI::App& app, int argc, char** argv) {
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
