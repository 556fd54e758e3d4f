// libFuzzer target: the manifest of a training checkpoint (io/train_checkpoint.hpp), the JSON that
// `laga train --resume` trusts to name the state file, its size and checksum, the step, the data
// stream's position, the loss history and the run's identity.
//
// The bar: only usage errors (exit 2 naming the key), never a crash, a hang or another exception.
// The manifest's own checksum is checked in one parse and skipped in a second, so the field checks
// are reached by inputs the fuzzer could never checksum. A manifest that parses survives
// train_manifest_to_text -> parse_train_manifest unchanged (with the checksum checked).
#include <cstdint>
#include <cstring>
#include <string>

#include "fuzz_check.hpp"
#include "laga/io/train_checkpoint.hpp"

namespace {

bool same(const laga::TrainManifest& a, const laga::TrainManifest& b) {
  if (a.step != b.step || a.next_step != b.next_step || a.next_data_seed != b.next_data_seed)
    return false;
  if (a.losses.size() != b.losses.size() || a.identity != b.identity ||
      a.files.size() != b.files.size())
    return false;
  for (size_t i = 0; i < a.losses.size(); ++i)
    if (std::memcmp(&a.losses[i], &b.losses[i], 8) != 0) return false;
  for (size_t i = 0; i < a.files.size(); ++i)
    if (a.files[i].name != b.files[i].name || a.files[i].bytes != b.files[i].bytes ||
        a.files[i].fnv1a64 != b.files[i].fnv1a64)
      return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  laga::fuzz::expect_usage_error([&] { laga::parse_train_manifest(text, "fuzz manifest", true); });
  laga::TrainManifest m;
  const bool failed = laga::fuzz::expect_usage_error(
      [&] { m = laga::parse_train_manifest(text, "fuzz manifest", false); });
  if (failed) return 0;
  laga::TrainManifest back;
  const bool refused = laga::fuzz::expect_usage_error([&] {
    back = laga::parse_train_manifest(laga::train_manifest_to_text(m), "round trip", true);
  });
  FUZZ_CHECK(!refused, "a manifest written by train_manifest_to_text is refused");
  FUZZ_CHECK(same(m, back), "a manifest changed in the round trip through train_manifest_to_text");
  return 0;
}
