// laga::Error: a usage error reads as its message alone (it is about the user's input, and the
// source location is noise to them); a failure or an internal error appends "(file:line)", for
// whoever debugs laga.
#include "laga/core/error.hpp"

#include <cstring>

namespace laga {

static const char* short_file(const char* file) {
  // Keep the path from the project's top folders on so messages stay one line.
  for (const char* top : {"src/", "include/", "tools/", "reference/", "tests/", "bench/"}) {
    if (const char* p = std::strstr(file, top)) return p;
  }
  return file;
}

Error::Error(ErrorKind kind, const char* file, int line, const std::string& message)
    : std::runtime_error(kind == ErrorKind::usage
                             ? message
                             : fmt::format("{} ({}:{})", message, short_file(file), line)),
      kind_(kind),
      file_(short_file(file)),
      line_(line),
      message_(message) {}

int Error::exit_status() const {
  switch (kind_) {
    case ErrorKind::usage:
      return 2;
    case ErrorKind::failure:
      return 1;
    case ErrorKind::internal:
      return 3;
  }
  return 3;
}

std::string divisors_str(int64_t n) {
  // Searching 1..n took as many steps as n when n has few divisors: a hang for --seq
  // 13333333333333333 (found by fuzz_cli). The search stops at kSearch; a larger n is then listed
  // after its small divisors.
  constexpr int64_t kSearch = int64_t(1) << 20;
  std::string out;
  int shown = 0;
  for (int64_t d = 1; d <= n && d <= kSearch && shown < 12; ++d)
    if (n % d == 0) out += (shown++ ? ", " : "") + std::to_string(d);
  if (n > kSearch && shown < 12) out += (shown ? ", " : "") + std::to_string(n);
  return out;
}

}  // namespace laga
