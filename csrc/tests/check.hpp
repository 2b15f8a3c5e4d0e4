// A minimal test harness: TEST_CASE registers a function under a group, CHECK
// records a failed expression with its file:line and carries on, and main()
// (main.cpp) runs the groups named on its command line and exits non-zero if
// any check failed or any case threw.
#pragma once

#include <cstdio>
#include <sstream>
#include <string>

namespace hr_test {

using CaseFn = void (*)();

struct Register {
  Register(const char* group, const char* name, CaseFn fn);
};

void fail(const char* file, int line, const std::string& what);

template <typename A, typename B>
std::string describe_pair(const char* a_text, const char* b_text, const A& a, const B& b) {
  std::ostringstream os;
  os.precision(17);
  os << a_text << " == " << b_text << "  (" << a << " vs " << b << ")";
  return os.str();
}

}  // namespace hr_test

#define HR_TEST_CAT2(a, b) a##b
#define HR_TEST_CAT(a, b) HR_TEST_CAT2(a, b)

// TEST_CASE(group, name) { ... }: `group` is what the ctest test names.
#define TEST_CASE(group, name)                                                                             \
  static void HR_TEST_CAT(test_, name)();                                                                  \
  static const ::hr_test::Register HR_TEST_CAT(register_, name)(#group, #name, &HR_TEST_CAT(test_, name)); \
  static void HR_TEST_CAT(test_, name)()

#define CHECK(expr)                                                       \
  do {                                                                    \
    if (!(expr)) ::hr_test::fail(__FILE__, __LINE__, "CHECK(" #expr ")"); \
  } while (0)

#define CHECK_EQ(a, b)                                                                     \
  do {                                                                                     \
    const auto& hr_a_ = (a);                                                               \
    const auto& hr_b_ = (b);                                                               \
    if (!(hr_a_ == hr_b_))                                                                 \
      ::hr_test::fail(__FILE__, __LINE__, ::hr_test::describe_pair(#a, #b, hr_a_, hr_b_)); \
  } while (0)

// The statement must throw `Exc` (or a type derived from it).
#define CHECK_THROWS_AS(stmt, Exc)                                                          \
  do {                                                                                      \
    bool hr_caught_ = false;                                                                \
    try {                                                                                   \
      stmt;                                                                                 \
    } catch (const Exc&) {                                                                  \
      hr_caught_ = true;                                                                    \
    } catch (...) {                                                                         \
    }                                                                                       \
    if (!hr_caught_) ::hr_test::fail(__FILE__, __LINE__, "expected " #Exc " from: " #stmt); \
  } while (0)
