// Reading and writing the .safetensors format: an 8-byte little-endian header length n, n bytes
// of JSON header (an object: tensor name -> {dtype, shape, data_offsets}, plus an optional
// "__metadata__" object of strings), then the raw little-endian data section, with data_offsets
// relative to its start.
//
// Reading is strict, like the reference implementation (huggingface/safetensors): the tensors
// must tile the data section exactly — sorted by offset, the first starts at 0, each starts where
// the previous ends, the last ends at the end of the file — so gaps, overlaps and trailing bytes
// are rejected. Every malformation is a usage error (exit 2) naming the file and the problem; no
// input makes the reader crash or read out of bounds, so it can be fuzzed. Limits: header at most
// 100 MB (as the reference implementation), at most 32 dimensions per tensor.
//
// Every dtype of the format is recognised (so a checkpoint with integer or FP8 tensors opens);
// F32, BF16, F16 and F64 can be loaded, converted to fp32 or bf16 (F64 -> bf16 rounds through
// fp32). Tensors are written as F32 or BF16.
//
// Not here: the names of weights in checkpoints (io/checkpoint.hpp). This file assumes a
// little-endian host.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "laga/core/tensor.hpp"

namespace laga {

// The header's limit on its own length, in bytes.
inline constexpr int64_t kSafetensorsMaxHeaderBytes = 100'000'000;

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as in the file: "F32", "BF16", "F16", "F64", "I64", ...
  Shape shape;
  int64_t begin = 0;  // byte offsets into the data section, [begin, end)
  int64_t end = 0;
  int64_t numel() const { return shape_numel(shape); }
  int64_t nbytes() const { return end - begin; }
};

// "F32" for fp32, "BF16" for bf16.
std::string safetensors_dtype_name(DType dtype);

// Writes the tensors in the given order (header and data alike), each as its own dtype, or all as
// store_as when given (converted through an untracked buffer, so writing never moves the memory
// accounting). Names must be distinct and not "__metadata__". Usage error naming the path when
// the file cannot be written.
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       std::optional<DType> store_as = std::nullopt);

class SafetensorsFile {
 public:
  // Reads and validates the header; tensor data is read by load(), from the file each time.
  static SafetensorsFile open(const std::string& path);
  // The same validation over bytes in memory (tests, fuzzing); label names them in errors.
  static SafetensorsFile from_bytes(std::string bytes, const std::string& label);

  const std::string& path() const { return path_; }                 // or the label
  const std::vector<std::string>& names() const { return names_; }  // in header order
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // usage error if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // A new tensor of the requested dtype (converting), from the current tracker under tag.
  Tensor load(const std::string& name, DType dtype, const std::string& tag) const;

 private:
  static SafetensorsFile parse(const std::string& label, int64_t file_bytes,
                               const std::string& header);
  void read_data(const SafetensorsEntry& e, void* out) const;

  std::string path_;
  int64_t data_start_ = 0;                    // 8 + header length
  std::shared_ptr<const std::string> bytes_;  // from_bytes: the whole file; open: null
  std::vector<std::string> names_;
  std::map<std::string, SafetensorsEntry> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace laga
