// libFuzzer target: the .safetensors reader on arbitrary bytes (io/safetensors.hpp), and weights
// loaded from whatever it accepts (io/checkpoint.hpp).
//
// The bar: every input is either rejected with a usage error or accepted consistently —
// from_bytes() and open() of the same bytes agree on every name, dtype, shape and offset; every
// entry lies inside the data section; each loadable tensor loads as fp32 and bf16 with the file's
// values (bf16 ones the fp32 ones rounded); an unloadable dtype is a usage error. Anything else
// aborts: a crash, a hang, an exception of another kind, or a sanitizer report.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "fuzz_check.hpp"
#include "laga/core/error.hpp"
#include "laga/io/checkpoint.hpp"
#include "laga/io/safetensors.hpp"

namespace laga::fuzz {
namespace {

// A model small enough that a hand-made checkpoint of it is a few hundred bytes, so that the fuzzer
// reaches load_weights' success path; q_lora_rank on and off.
MlaConfig micro(int64_t q_lora_rank) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.model = "micro";
  c.hidden_size = 4, c.num_attention_heads = 2, c.q_lora_rank = q_lora_rank, c.kv_lora_rank = 2;
  c.qk_nope_head_dim = 2, c.qk_rope_head_dim = 2, c.v_head_dim = 2;
  c.dtype = DType::f32;
  (void)Config(c);
  return c;
}

// A file of this process's own, for the bytes under test; removed at exit.
struct ScratchFile {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("laga-fuzz-" + std::to_string(::getpid()) + ".safetensors"))
                         .string();
  ~ScratchFile() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
};

const std::string& scratch_path() {
  static const ScratchFile file;
  return file.path;
}

bool same_bits_or_both_nan(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0;
}

void check_loads(const SafetensorsFile& f, const std::string& bytes) {
  const int64_t data_start = int64_t(bytes.size()) - [&] {
    int64_t data = 0;
    for (const auto& name : f.names()) data += f.entry(name).nbytes();
    return data;
  }();
  for (const auto& name : f.names()) {
    const SafetensorsEntry& e = f.entry(name);
    FUZZ_CHECK(0 <= e.begin && e.begin <= e.end && data_start + e.end <= int64_t(bytes.size()),
               "entry out of range");
    const bool loadable =
        e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16" || e.dtype == "F64";
    if (!loadable) {
      FUZZ_CHECK(expect_usage_error([&] { f.load(name, DType::f32, "fuzz"); }),
                 "unloadable dtype did not throw");
      continue;
    }
    Tensor t32 = f.load(name, DType::f32, "fuzz");
    Tensor t16 = f.load(name, DType::bf16, "fuzz");
    FUZZ_CHECK(t32.shape() == e.shape && t16.shape() == e.shape,
               "loaded shape differs from the header's");
    const unsigned char* raw =
        reinterpret_cast<const unsigned char*>(bytes.data()) + data_start + e.begin;
    if (e.dtype == "F32")
      FUZZ_CHECK(e.nbytes() == 0 || std::memcmp(t32.raw(), raw, size_t(e.nbytes())) == 0,
                 "F32 not loaded verbatim");
    if (e.dtype == "BF16")
      FUZZ_CHECK(e.nbytes() == 0 || std::memcmp(t16.raw(), raw, size_t(e.nbytes())) == 0,
                 "BF16 not loaded verbatim");
    else
      for (int64_t i = 0; i < t32.numel(); ++i)
        FUZZ_CHECK(same_bits_or_both_nan(t16.get(i), round_to(DType::bf16, t32.get(i))),
                   "bf16 load is not the fp32 load rounded");
  }
}

}  // namespace
}  // namespace laga::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace laga;
  using namespace laga::fuzz;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::optional<SafetensorsFile> mem;
  if (!expect_usage_error([&] { mem = SafetensorsFile::from_bytes(bytes, "fuzz"); }))
    check_loads(*mem, bytes);

  // The same bytes from a file: the same verdict and the same entries.
  {
    std::ofstream out(scratch_path(), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
  }
  std::optional<SafetensorsFile> file;
  const bool rejected = expect_usage_error([&] { file = SafetensorsFile::open(scratch_path()); });
  FUZZ_CHECK(rejected == !mem.has_value(),
             "open() and from_bytes() disagree on whether the bytes are valid");
  if (rejected) return 0;
  FUZZ_CHECK(file->names() == mem->names() && file->metadata() == mem->metadata(),
             "open() and from_bytes() differ");
  for (const auto& name : mem->names()) {
    const SafetensorsEntry &a = file->entry(name), &b = mem->entry(name);
    FUZZ_CHECK(a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin && a.end == b.end,
               "open() and from_bytes() differ on an entry");
  }
  check_loads(*file, bytes);

  // Weights by name, in either naming, for a model of the file's size.
  for (int64_t q_lora_rank : {2, 0}) {
    const MlaConfig c = micro(q_lora_rank);
    std::optional<Weights> w;
    if (!expect_usage_error([&] { w = load_weights(scratch_path(), c); }))
      FUZZ_CHECK(w->layers.size() == 1, "load_weights returned the wrong number of layers");
  }
  return 0;
}
