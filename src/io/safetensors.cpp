// The .safetensors reader and writer (format and policy at the top of io/safetensors.hpp).
//
// The header is parsed by nlohmann::ordered_json (to keep the file's order) with a callback that
// rejects duplicate keys (the library would otherwise keep the last one silently) and nesting
// deeper than a header needs. Every integer from the header is range-checked before it becomes a
// size or an offset.
#include "laga/io/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

namespace laga {

static_assert(std::endian::native == std::endian::little,
              "laga's safetensors I/O assumes a little-endian host");

namespace {

struct DtypeInfo {
  const char* name;
  int64_t size;
};

// Every dtype of the format, so a checkpoint holding tensors laga does not load still opens.
constexpr DtypeInfo kDtypes[] = {{"BOOL", 1},    {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1},
                                 {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
                                 {"BF16", 2},    {"I32", 4}, {"U32", 4}, {"F32", 4},
                                 {"F64", 8},     {"I64", 8}, {"U64", 8}};
constexpr const char* kLoadable = "F32, BF16, F16, F64";
constexpr int64_t kMaxRank = 32;
constexpr int kMaxDepth = 8;  // a header needs 3: object -> entry object -> array

const DtypeInfo* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::string known_dtypes() {
  std::string s;
  for (const auto& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);  // inf or NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      mantissa <<= 1;
    } while (!(mantissa & 0x400u));
    bits = sign | (uint32_t(112 - e) << 23) | ((mantissa & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

// Thrown by the JSON parse callback; becomes a usage error naming the file.
struct HeaderProblem {
  std::string what;
};

// A non-negative int64 from a JSON value, or a usage error describing `what`.
int64_t header_int(const nlohmann::ordered_json& v, const std::string& label,
                   const std::string& what) {
  LAGA_CHECK(v.is_number_integer(), "{}: {} is {}, not an integer", label, what, v.dump());
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    LAGA_CHECK(u <= uint64_t(std::numeric_limits<int64_t>::max()), "{}: {} = {} is out of range",
               label, what, u);
    return int64_t(u);
  }
  int64_t i = v.get<int64_t>();
  LAGA_CHECK(i >= 0, "{}: {} = {} is negative", label, what, i);
  return i;
}

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File open_for_reading(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  LAGA_CHECK(f, "{}: cannot open for reading: {}", path, std::strerror(errno));
  return f;
}

// Exactly n bytes at offset, or a usage error (the file may have changed since it was opened).
void read_exact(std::FILE* f, const std::string& path, int64_t offset, void* out, int64_t n) {
  LAGA_CHECK(fseeko(f, off_t(offset), SEEK_SET) == 0, "{}: cannot seek to byte {}: {}", path,
             offset, std::strerror(errno));
  if (n == 0) return;
  size_t got = std::fread(out, 1, size_t(n), f);
  LAGA_CHECK(got == size_t(n), "{}: expected {} bytes at byte {}, read {} (file truncated?)", path,
             n, offset, got);
}

void check_file_size(const std::string& label, int64_t file_bytes) {
  LAGA_CHECK(file_bytes >= 8,
             "{}: file too short for a safetensors file ({} bytes; the header length alone is 8)",
             label, file_bytes);
}

void check_header_length(const std::string& label, uint64_t n, int64_t file_bytes) {
  LAGA_CHECK(n <= uint64_t(kSafetensorsMaxHeaderBytes),
             "{}: header length {} exceeds the limit of {} bytes", label, n,
             kSafetensorsMaxHeaderBytes);
  LAGA_CHECK(int64_t(n) <= file_bytes - 8,
             "{}: header length {} is larger than the {} bytes that follow it", label, n,
             file_bytes - 8);
}

}  // namespace

std::string safetensors_dtype_name(DType dtype) {
  return dtype == DType::f32 ? "F32" : dtype == DType::bf16 ? "BF16" : "I32";
}

// ---------------------------------------------------------------------------------------------
// Writing

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       std::optional<DType> store_as) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header["__metadata__"] = m;
  }
  std::set<std::string> seen;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    LAGA_CHECK(name != "__metadata__",
               "{}: a tensor cannot be named '__metadata__' (reserved for metadata)", path);
    LAGA_CHECK(seen.insert(name).second, "{}: tensor name '{}' given twice; names must be distinct",
               path, name);
    LAGA_CHECK(t && t->defined(), "{}: tensor '{}' is undefined", path, name);
    // indices keep their own dtype whatever store_as says of the values
    const DType dtype = t->dtype() == DType::i32 ? DType::i32 : store_as.value_or(t->dtype());
    const int64_t bytes = t->numel() * dtype_size(dtype);
    header[name] = {{"dtype", safetensors_dtype_name(dtype)},
                    {"shape", t->shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned

  File f(std::fopen(path.c_str(), "wb"));
  LAGA_CHECK(f, "{}: cannot open for writing: {}; choose a writable path", path,
             std::strerror(errno));
  auto put = [&](const void* p, size_t n) {
    LAGA_CHECK(n == 0 || std::fwrite(p, 1, n, f.get()) == n, "{}: write failed: {}", path,
               std::strerror(errno));
  };
  const uint64_t n = text.size();
  put(&n, 8);
  put(text.data(), text.size());
  std::vector<unsigned char> buffer;
  for (const auto& [name, t] : tensors) {
    const DType dtype = t->dtype() == DType::i32 ? DType::i32 : store_as.value_or(t->dtype());
    if (dtype == t->dtype()) {
      put(t->raw(), size_t(t->nbytes()));
      continue;
    }
    constexpr int64_t kChunk = 1 << 16;
    buffer.resize(size_t(kChunk * dtype_size(dtype)));
    for (int64_t i0 = 0; i0 < t->numel(); i0 += kChunk) {
      const int64_t m = std::min(kChunk, t->numel() - i0);
      for (int64_t i = 0; i < m; ++i) {
        const float v = t->get(i0 + i);
        if (dtype == DType::f32)
          std::memcpy(buffer.data() + 4 * i, &v, 4);
        else {
          const bf16 b = to_bf16(v);
          std::memcpy(buffer.data() + 2 * i, &b.bits, 2);
        }
      }
      put(buffer.data(), size_t(m * dtype_size(dtype)));
    }
  }
  std::FILE* raw = f.release();
  LAGA_CHECK(std::fclose(raw) == 0, "{}: write failed on close: {}", path, std::strerror(errno));
}

// ---------------------------------------------------------------------------------------------
// Reading

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  LAGA_CHECK(std::filesystem::exists(status), "{}: no such file", path);
  LAGA_CHECK(std::filesystem::is_regular_file(status),
             "{}: not a regular file; give a .safetensors file", path);
  File f = open_for_reading(path);
  LAGA_CHECK(fseeko(f.get(), 0, SEEK_END) == 0, "{}: cannot seek: {}", path, std::strerror(errno));
  const int64_t file_bytes = int64_t(ftello(f.get()));
  LAGA_CHECK(file_bytes >= 0, "{}: cannot tell its size: {}", path, std::strerror(errno));
  check_file_size(path, file_bytes);
  uint64_t n = 0;
  read_exact(f.get(), path, 0, &n, 8);
  check_header_length(path, n, file_bytes);
  std::string header(size_t(n), '\0');
  read_exact(f.get(), path, 8, header.data(), int64_t(n));
  return parse(path, file_bytes, header);
}

SafetensorsFile SafetensorsFile::from_bytes(std::string bytes, const std::string& label) {
  const int64_t size = int64_t(bytes.size());
  check_file_size(label, size);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  check_header_length(label, n, size);
  SafetensorsFile s = parse(label, size, bytes.substr(8, size_t(n)));
  s.bytes_ = std::make_shared<const std::string>(std::move(bytes));
  return s;
}

// Long on purpose: the header read and checked field by field, in the order of the format.
SafetensorsFile SafetensorsFile::parse(const std::string& label, int64_t file_bytes,
                                       const std::string& header) {
  SafetensorsFile s;
  s.path_ = label;
  s.data_start_ = 8 + int64_t(header.size());
  const int64_t data_bytes = file_bytes - s.data_start_;

  // Keys seen in each open object, innermost last: a duplicate key anywhere is an error.
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int depth, nlohmann::ordered_json::parse_event_t event,
                      nlohmann::ordered_json& parsed) {
    using E = nlohmann::ordered_json::parse_event_t;
    if (depth > kMaxDepth)
      throw HeaderProblem{fmt::format("JSON nested deeper than {} levels", kMaxDepth)};
    if (event == E::object_start)
      open_objects.emplace_back();
    else if (event == E::object_end && !open_objects.empty())
      open_objects.pop_back();
    else if (event == E::key && !open_objects.empty() &&
             !open_objects.back().insert(parsed.get<std::string>()).second)
      throw HeaderProblem{fmt::format("duplicate key {}", parsed.dump())};
    return true;
  };
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(header.begin(), header.end(), callback,
                                      /*allow_exceptions=*/true);
  } catch (const HeaderProblem& p) {
    LAGA_FAIL_USAGE("{}: header: {}", label, p.what);
  } catch (const nlohmann::ordered_json::exception& e) {
    LAGA_FAIL_USAGE("{}: header is not valid JSON ({})", label, e.what());
  }
  LAGA_CHECK(j.is_object(), "{}: header is a JSON {}, not an object", label, j.type_name());

  for (const auto& [name, value] : j.items()) {
    if (name == "__metadata__") {
      LAGA_CHECK(value.is_object(), "{}: __metadata__ is a JSON {}, not an object of strings",
                 label, value.type_name());
      for (const auto& [k, v] : value.items()) {
        LAGA_CHECK(v.is_string(), "{}: __metadata__ value '{}' is a JSON {}, not a string", label,
                   k, v.type_name());
        s.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("tensor '{}'", name);
    LAGA_CHECK(value.is_object(),
               "{}: {} is a JSON {}, not an object with dtype, shape and data_offsets", label,
               where, value.type_name());
    for (const char* key : {"dtype", "shape", "data_offsets"})
      LAGA_CHECK(value.contains(key), "{}: {} has no '{}'", label, where, key);

    SafetensorsEntry e;
    e.name = name;
    LAGA_CHECK(value["dtype"].is_string(), "{}: {} has dtype {}, not a string", label, where,
               value["dtype"].dump());
    e.dtype = value["dtype"].get<std::string>();
    const DtypeInfo* info = find_dtype(e.dtype);
    LAGA_CHECK(info, "{}: {} has unknown dtype '{}'; valid: {}", label, where, e.dtype,
               known_dtypes());

    const auto& shape = value["shape"];
    LAGA_CHECK(shape.is_array(), "{}: {} has shape {}, not an array", label, where, shape.dump());
    LAGA_CHECK(int64_t(shape.size()) <= kMaxRank,
               "{}: {} has {} dimensions; at most {} are supported", label, where, shape.size(),
               kMaxRank);
    int64_t numel = 1;
    for (size_t i = 0; i < shape.size(); ++i) {
      const int64_t d = header_int(shape[i], label, fmt::format("{} dimension {}", where, i));
      e.shape.push_back(d);
      LAGA_CHECK(!__builtin_mul_overflow(numel, d, &numel),
                 "{}: {} has shape {} whose element count overflows", label, where, shape.dump());
    }
    int64_t expected_bytes = 0;
    LAGA_CHECK(!__builtin_mul_overflow(numel, info->size, &expected_bytes),
               "{}: {} has shape {} whose size in bytes overflows", label, where, shape.dump());

    const auto& offsets = value["data_offsets"];
    LAGA_CHECK(offsets.is_array() && offsets.size() == 2,
               "{}: {} has data_offsets {}, not an array [begin, end]", label, where,
               offsets.dump());
    e.begin = header_int(offsets[0], label, where + " data_offsets begin");
    e.end = header_int(offsets[1], label, where + " data_offsets end");
    LAGA_CHECK(e.begin <= e.end, "{}: {} has data_offsets [{}, {}] with begin after end", label,
               where, e.begin, e.end);
    LAGA_CHECK(e.end <= data_bytes,
               "{}: {} has data_offsets [{}, {}] beyond the {}-byte data section (file truncated?)",
               label, where, e.begin, e.end, data_bytes);
    LAGA_CHECK(e.end - e.begin == expected_bytes,
               "{}: {} has data_offsets [{}, {}] ({} bytes) but shape {} of {} needs {} bytes",
               label, where, e.begin, e.end, e.end - e.begin, shape_str(e.shape), e.dtype,
               expected_bytes);
    s.names_.push_back(name);
    s.index_.emplace(name, std::move(e));
  }

  // The tensors must tile the data section exactly.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const auto& [name, e] : s.index_) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
              return std::pair(a->begin, a->end) < std::pair(b->begin, b->end);
            });
  int64_t covered = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry* e : by_offset) {
    LAGA_CHECK(e->begin >= covered,
               "{}: tensor '{}' at data_offsets [{}, {}] overlaps tensor '{}' ending at {}", label,
               e->name, e->begin, e->end, previous ? previous->name : "", covered);
    LAGA_CHECK(e->begin == covered,
               "{}: gap of {} bytes before tensor '{}' at data_offsets [{}, {}]", label,
               e->begin - covered, e->name, e->begin, e->end);
    covered = e->end;
    previous = e;
  }
  LAGA_CHECK(covered == data_bytes,
             "{}: {} bytes after the last tensor's data (data section {} bytes, tensors end at {})",
             label, data_bytes - covered, data_bytes, covered);
  return s;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
  auto it = index_.find(name);
  if (it != index_.end()) return it->second;
  std::string some;
  for (size_t i = 0; i < names_.size() && i < 8; ++i) some += (i ? ", " : "") + names_[i];
  if (names_.size() > 8) some += fmt::format(", ... ({} in all)", names_.size());
  LAGA_FAIL_USAGE("{}: no tensor named '{}'; it holds {}", path_, name,
                  names_.empty() ? "no tensors" : some);
}

void SafetensorsFile::read_data(const SafetensorsEntry& e, void* out) const {
  if (bytes_) {
    LAGA_ASSERT(data_start_ + e.end <= int64_t(bytes_->size()),
                "{}: validated offsets out of range", path_);
    if (e.nbytes()) std::memcpy(out, bytes_->data() + data_start_ + e.begin, size_t(e.nbytes()));
    return;
  }
  File f = open_for_reading(path_);
  read_exact(f.get(), path_, data_start_ + e.begin, out, e.nbytes());
}

Tensor SafetensorsFile::load(const std::string& name, DType dtype, const std::string& tag) const {
  const SafetensorsEntry& e = entry(name);
  const bool loadable =
      e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16" || e.dtype == "F64";
  LAGA_CHECK(loadable, "{}: tensor '{}' is {}, which laga cannot load; loadable: {}{}", path_, name,
             e.dtype, kLoadable,
             e.dtype.starts_with("F8")
                 ? " (dequantise an FP8 checkpoint with its weight_scale_inv to BF16 first)"
                 : "");
  Tensor t = Tensor::empty(e.shape, dtype, tag);
  if (e.dtype == safetensors_dtype_name(dtype)) {
    read_data(e, t.raw());
    return t;
  }
  std::vector<unsigned char> raw(size_t(e.nbytes()));
  read_data(e, raw.data());
  const unsigned char* p = raw.data();
  for (int64_t i = 0; i < t.numel(); ++i) {
    float v;
    if (e.dtype == "F32") {
      std::memcpy(&v, p + 4 * i, 4);
    } else if (e.dtype == "BF16") {
      bf16 b;
      std::memcpy(&b.bits, p + 2 * i, 2);
      v = to_float(b);
    } else if (e.dtype == "F16") {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      v = half_to_float(h);
    } else {
      double d;
      std::memcpy(&d, p + 8 * i, 8);
      v = float(d);
    }
    t.set(i, v);
  }
  return t;
}

}  // namespace laga
