// Numbers in error messages: the shortest text that reads back as the same
// value (std::to_string would print a TD error of -1e-9 as "-0.000000").
#pragma once

#include <charconv>
#include <string>

namespace hetero_replay {

template <typename T>
std::string exact(T value) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, res.ptr);
}

}  // namespace hetero_replay
