// The one exception type of laga, and the checks that raise it.
//
// Every error carries the file:line that raised it and a kind that maps to the CLI's exit status:
// usage (bad input or configuration, exit 2), failure (a check of results failed, exit 1) and
// internal (a broken invariant, exit 3). what() is the message alone for a usage error, which is
// about the user's input, and "message (file:line)" for the other kinds. Messages name the
// offending value and, where one exists, a valid alternative. Checks belong at boundaries, never in
// hot loops.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace laga {

enum class ErrorKind { usage, failure, internal };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const char* file, int line, const std::string& message);

  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }  // without the file:line
  const char* file() const { return file_; }
  int line() const { return line_; }
  int exit_status() const;  // 2 usage, 1 failure, 3 internal

 private:
  ErrorKind kind_;
  const char* file_;
  int line_;
  std::string message_;
};

// Divisors of n, for "try ..." suggestions: the first 12, smallest first, from those up to 2^20 and
// n.
std::string divisors_str(int64_t n);

}  // namespace laga

// Bad input or configuration at an API or CLI boundary.
#define LAGA_CHECK(cond, ...)                                                                      \
  do {                                                                                             \
    if (!(cond))                                                                                   \
      throw ::laga::Error(::laga::ErrorKind::usage, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

#define LAGA_FAIL_USAGE(...) \
  throw ::laga::Error(::laga::ErrorKind::usage, __FILE__, __LINE__, fmt::format(__VA_ARGS__))

// An invariant of laga itself; failing it is a bug in laga, not in the input.
#define LAGA_ASSERT(cond, ...)                                             \
  do {                                                                     \
    if (!(cond))                                                           \
      throw ::laga::Error(::laga::ErrorKind::internal, __FILE__, __LINE__, \
                          fmt::format(__VA_ARGS__));                       \
  } while (0)

// Something asked for that laga does not implement (yet): an error, never a silent fallback.
#define LAGA_NOT_IMPLEMENTED(...)                                   \
  throw ::laga::Error(::laga::ErrorKind::usage, __FILE__, __LINE__, \
                      "not implemented: " + fmt::format(__VA_ARGS__))
