// libFuzzer target: the configuration parser (mla/config.hpp) on arbitrary text — JSON parsed by
// nlohmann as `laga run --config FILE` parses it, then MlaConfig::from_json with and without
// validation — and MlaConfig::preset on the same text as a preset name.
//
// The bar: every input is either rejected with a usage error or gives a configuration that keeps
// its word — one that validates has finite, positive derived quantities (softmax scale, RoPE
// attention factor, every RoPE inverse frequency) and survives to_json -> from_json unchanged;
// validate() throws exactly when problems() lists something. Anything else aborts.
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_check.hpp"
#include "laga/mla/config.hpp"

namespace laga::fuzz {
namespace {

void check_config(const MlaConfig& c) {
  const bool valid = c.problems().empty();
  FUZZ_CHECK(expect_usage_error([&] { (void)Config(c); }) == !valid,
             "validate() disagrees with problems()");
  if (!valid) return;
  FUZZ_CHECK(std::isfinite(c.softmax_scale()) && c.softmax_scale() > 0,
             "valid config, bad softmax scale");
  FUZZ_CHECK(std::isfinite(rope_attention_factor(c.rope())) && rope_attention_factor(c.rope()) > 0,
             "valid config, bad RoPE attention factor");
  for (double f : rope_inv_freq(c.rope()))
    FUZZ_CHECK(std::isfinite(f) && f > 0, "valid config, bad RoPE inverse frequency");
  const nlohmann::json j = c.to_json();
  std::optional<MlaConfig> back;
  FUZZ_CHECK(!expect_usage_error([&] { back = MlaConfig::from_json(j); }),
             "a valid config's JSON does not load back");
  FUZZ_CHECK(back->to_json() == j, "to_json -> from_json changed the configuration");
}

}  // namespace
}  // namespace laga::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace laga;
  using namespace laga::fuzz;
  const std::string text(reinterpret_cast<const char*>(data), size);

  std::optional<MlaConfig> preset;
  if (!expect_usage_error([&] { preset = MlaConfig::preset(text); })) check_config(*preset);

  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  std::optional<MlaConfig> unvalidated;
  if (expect_usage_error([&] { unvalidated = MlaConfig::from_json(j); })) {
    FUZZ_CHECK(expect_usage_error([&] { MlaConfig::from_json(j); }),
               "from_json rejects only when not validating");
    return 0;
  }
  check_config(*unvalidated);
  std::optional<MlaConfig> validated;
  const bool rejected = expect_usage_error([&] { validated = *Config(MlaConfig::from_json(j)); });
  FUZZ_CHECK(rejected == !unvalidated->problems().empty(),
             "from_json's validation disagrees with problems()");
  return 0;
}
