// An agent's incarnation is a credential: unguessable, never the same twice.
#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "daemon/agent/coordinator_link.h"

namespace shardsync::agent {
namespace {

TEST_CASE("incarnations are 128 random bits in hex, each new") {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    const std::string incarnation = NewIncarnation();
    REQUIRE(incarnation.size() == 32);
    REQUIRE(incarnation.find_first_not_of("0123456789abcdef") == std::string::npos);
    seen.insert(incarnation);
  }
  CHECK(seen.size() == 1000);
}

}  // namespace
}  // namespace shardsync::agent
