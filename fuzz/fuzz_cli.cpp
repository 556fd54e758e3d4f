// libFuzzer target: the laga command line (tools/laga/parse.hpp) — parsing argv into the flags and
// building and validating the configuration — without running any command. The input is the
// arguments after "laga", one per line.
//
// The bar: the CLI ends with 0 (it would run, or --help) or 2 (bad usage, one message naming the
// value); never 1 or 3, never a crash, a hang or an exception that escapes.
//
// Files: an argument holding '/' is skipped (the input is ignored), so --config names a file in the
// working directory only; scripts/fuzz.sh and the replay test run this target in fuzz/cli_cwd/, which
// holds a few configuration files for --config to find.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "parse.hpp"

namespace {
constexpr size_t kMaxArgs = 64;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  if (text.find('/') != std::string::npos) return 0;
  std::vector<std::string> args{"laga"};
  for (size_t begin = 0; begin < text.size() && args.size() <= kMaxArgs;) {
    size_t end = std::min(text.find('\n', begin), text.size());
    args.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  const int status = laga::cli::parse_only(int(argv.size()), argv.data());
  FUZZ_CHECK(status == 0 || status == 2, "the command line ended with a status other than 0 or 2");
  return 0;
}
