// libFuzzer target: the laga command line (tools/laga/parse.hpp) — parsing argv into the flags and
// building and validating the configuration — without running any command. The input is the
// arguments after "laga", one per line.
//
// The bar: the CLI ends with 0 (it would run, or --help) or 2 (bad usage, one message naming the
// value); never 1 or 3, never a crash, a hang or an exception that escapes.
//
// The parse reuses one CLI11 App (parse.hpp); the oracle also parses with a freshly built App and
// requires the same status and the same messages, on every input when replayed and on one input in
// 16 (by a hash of its bytes) under libFuzzer, so the reuse can never change what the CLI says.
//
// Files: an argument holding '/' is skipped (the input is ignored), so --config names a file in the
// working directory only; scripts/fuzz.sh and the replay test run this target in fuzz/cli_cwd/,
// which holds a few configuration files for --config to find.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <sstream>

#include "fuzz_check.hpp"
#include "laga/io/train_checkpoint.hpp"
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
  // LAGA_FUZZ_CLI_FRESH=1: every parse with a freshly built App, as before the App was reused (to
  // measure what the reuse gains; the oracle then compares two fresh parses).
  static const bool always_fresh = [] {
    const char* e = std::getenv("LAGA_FUZZ_CLI_FRESH");
    return e && std::string(e) == "1";
  }();
  std::ostringstream messages;
  const int status = laga::cli::parse_only(int(argv.size()), argv.data(), &messages, always_fresh);
  FUZZ_CHECK(status == 0 || status == 2, "the command line ended with a status other than 0 or 2");
#ifdef LAGA_FUZZ_LIBFUZZER
  const bool compare = laga::fnv1a64(data, size) % 16 == 0;
#else
  const bool compare = true;
#endif
  if (compare) {
    std::ostringstream fresh_messages;
    const int fresh =
        laga::cli::parse_only(int(argv.size()), argv.data(), &fresh_messages, /*fresh_app=*/true);
    FUZZ_CHECK(fresh == status, "the reused App and a fresh one end with different statuses");
    FUZZ_CHECK(fresh_messages.str() == messages.str(),
               "the reused App and a fresh one give different messages");
  }
  return 0;
}
