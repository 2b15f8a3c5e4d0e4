// Runs the test cases of the groups named on the command line (all if none).
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "check.hpp"

namespace hr_test {

namespace {

struct Case {
  const char* group;
  const char* name;
  CaseFn fn;
};

std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

int g_failures = 0;

}  // namespace

Register::Register(const char* group, const char* name, CaseFn fn) {
  registry().push_back({group, name, fn});
}

void fail(const char* file, int line, const std::string& what) {
  ++g_failures;
  std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what.c_str());
  std::fflush(stderr);
}

}  // namespace hr_test

int main(int argc, char** argv) {
  using namespace hr_test;
  std::vector<std::string> groups(argv + 1, argv + argc);
  int passed = 0, failed = 0;
  for (const Case& c : registry()) {
    bool selected = groups.empty();
    for (const std::string& g : groups) selected = selected || g == c.group;
    if (!selected) continue;
    std::printf("[ RUN  ] %s.%s\n", c.group, c.name);
    std::fflush(stdout);
    const int before = g_failures;
    try {
      c.fn();
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string("uncaught exception: ") + e.what());
    } catch (...) {
      fail(__FILE__, __LINE__, "uncaught exception of unknown type");
    }
    const bool ok = g_failures == before;
    std::printf("[ %s ] %s.%s\n", ok ? " OK " : "FAIL", c.group, c.name);
    std::fflush(stdout);
    ++(ok ? passed : failed);
  }
  if (passed + failed == 0) {
    std::fprintf(stderr, "no test case matches the groups given\n");
    return 2;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
