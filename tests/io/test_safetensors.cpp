// The .safetensors reader and writer: round trips, byte-exact files crafted by hand from the
// format's specification (an independent check: no Python safetensors package on this system),
// and a table of malformed files, each refused with a usage error that names the file and the
// problem. Truncating or corrupting a valid file must give an error or a valid file, never a crash.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "laga/core/random.hpp"
#include "laga/io/safetensors.hpp"
#include "support/temp_dir.hpp"

using namespace laga;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test (tests run in parallel processes under CTest).
class Safetensors : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return tmp_.path(name); }

  laga::testing::TempDir tmp_{"io"};
  MemoryTracker tracker_;
  TrackerScope scope_{tracker_};
};

// 8-byte little-endian header length, the header, the data: the format, spelt out.
std::string st_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + header + data;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string bytes_of(std::initializer_list<int> b) {
  std::string s;
  for (int v : b) s += char(v);
  return s;
}

Tensor random_tensor(const Shape& shape, DType dtype, const std::string& name) {
  Tensor t = Tensor::empty(shape, dtype, name);
  fill_normal(t, 7, name, 1.0);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), size_t(a.nbytes())) == 0;
}

}  // namespace

TEST_F(Safetensors, RoundTripsFp32AndBf16) {
  Tensor a = random_tensor({3, 5}, DType::f32, "a");
  Tensor b = random_tensor({4, 1, 6}, DType::bf16, "b");
  Tensor c = random_tensor({7}, DType::f32, "c");
  write_safetensors(path("t.safetensors"), {{"a", &a}, {"b.weight", &b}, {"c", &c}},
                    {{"format", "pt"}});

  auto f = SafetensorsFile::open(path("t.safetensors"));
  EXPECT_EQ(f.names(), (std::vector<std::string>{"a", "b.weight", "c"}));
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_EQ(f.entry("a").dtype, "F32");
  EXPECT_EQ(f.entry("b.weight").dtype, "BF16");
  EXPECT_EQ(f.entry("b.weight").shape, (Shape{4, 1, 6}));
  EXPECT_TRUE(same_bits(f.load("a", DType::f32, "t"), a));
  EXPECT_TRUE(same_bits(f.load("b.weight", DType::bf16, "t"), b));
  EXPECT_TRUE(same_bits(f.load("c", DType::f32, "t"), c));
}

TEST_F(Safetensors, WritesTheSpecifiedLayoutInInsertionOrder) {
  Tensor z = Tensor::from_floats({2}, DType::f32, {1.5f, -2.0f}, "z");
  Tensor a = Tensor::from_floats({1, 1}, DType::bf16, {1.0f}, "a");
  write_safetensors(path("t.safetensors"), {{"z", &z}, {"a", &a}}, {{"k", "v"}});
  const std::string bytes = read_file(path("t.safetensors"));

  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(uint8_t(bytes[size_t(i)])) << (8 * i);
  ASSERT_EQ(n % 8, 0u) << "the data section starts 8-byte aligned";
  ASSERT_EQ(bytes.size(), 8 + n + 8 + 2);
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.rfind('}'), header.find_last_not_of(' ')) << "padding is spaces after the JSON";
  EXPECT_EQ(header.substr(0, header.find_last_not_of(' ') + 1),
            R"({"__metadata__":{"k":"v"},"z":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("a":{"dtype":"BF16","shape":[1,1],"data_offsets":[8,10]}})");
  EXPECT_EQ(bytes.substr(8 + n),
            bytes_of({0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0, 0x80, 0x3f}));
}

TEST_F(Safetensors, ReadsAHandCraftedFileOfEveryLoadableDtype) {
  // Header order differs from data order, as files written by other libraries may have it.
  const std::string header =
      R"({"d":{"dtype":"F64","shape":[1],"data_offsets":[18,26]},"__metadata__":{"format":"pt"},)"
      R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},"a":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]},)"
      R"("c":{"dtype":"F16","shape":[3],"data_offsets":[12,18]},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[26,26]}}   )";
  // F32 1.5, -2
  const std::string data = bytes_of({0x00, 0x00, 0xc0, 0x3f, 0x00, 0x00, 0x00, 0xc0,
                                     // BF16 1, -0.5
                                     0x80, 0x3f, 0x00, 0xbf,
                                     // F16 1, 65504, -2^-24
                                     0x00, 0x3c, 0xff, 0x7b, 0x01, 0x80, 0x9a, 0x99, 0x99, 0x99,
                                     0x99, 0x99, 0xb9, 0x3f});  // F64 0.1
  write_file(path("h.safetensors"), st_bytes(header, data));
  auto f = SafetensorsFile::open(path("h.safetensors"));
  EXPECT_EQ(f.names(), (std::vector<std::string>{"d", "b", "a", "c", "e"}));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.load("a", DType::f32, "t").to_floats(), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(f.load("a", DType::f32, "t").shape(), (Shape{2, 1}));
  EXPECT_EQ(f.load("b", DType::f32, "t").to_floats(), (std::vector<float>{1.0f, -0.5f}));
  EXPECT_EQ(f.load("c", DType::f32, "t").to_floats(),
            (std::vector<float>{1.0f, 65504.0f, -std::ldexp(1.0f, -24)}));
  EXPECT_EQ(f.load("d", DType::f32, "t").to_floats(), (std::vector<float>{0.1f}));
  EXPECT_EQ(f.load("e", DType::f32, "t").shape(), (Shape{0, 3}));
  // The same bytes through memory.
  auto m = SafetensorsFile::from_bytes(st_bytes(header, data), "mem");
  EXPECT_EQ(m.load("c", DType::bf16, "t").to_floats(),
            (std::vector<float>{1.0f, 65536.0f, -std::ldexp(1.0f, -24)}));
}

TEST_F(Safetensors, ConvertsOnLoadRoundingToNearestEven) {
  Tensor a =
      Tensor::from_floats({3}, DType::f32, {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -3.14159f}, "a");
  write_safetensors(path("t.safetensors"), {{"a", &a}});
  auto f = SafetensorsFile::open(path("t.safetensors"));
  Tensor b = f.load("a", DType::bf16, "t");
  EXPECT_EQ(b.dtype(), DType::bf16);
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(b.get(i), round_to(DType::bf16, a.get(i)));
  // bf16 -> fp32 is exact.
  write_safetensors(path("u.safetensors"), {{"b", &b}});
  EXPECT_EQ(SafetensorsFile::open(path("u.safetensors")).load("b", DType::f32, "t").to_floats(),
            b.to_floats());
}

TEST_F(Safetensors, StoresAsTheRequestedDtypeWithoutTrackedAllocations) {
  Tensor b = random_tensor({300, 301}, DType::bf16, "b");  // more than one conversion chunk
  tracker_.reset_peak();
  const int64_t allocations = tracker_.allocations();
  write_safetensors(path("t.safetensors"), {{"b", &b}}, {}, DType::f32);
  EXPECT_EQ(tracker_.allocations(), allocations);
  auto f = SafetensorsFile::open(path("t.safetensors"));
  EXPECT_EQ(f.entry("b").dtype, "F32");
  EXPECT_EQ(f.load("b", DType::f32, "t").to_floats(), b.to_floats());
}

TEST_F(Safetensors, OpensDtypesItCannotLoadAndRefusesToLoadThem) {
  const std::string header = R"({"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                             R"("f":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  write_file(path("t.safetensors"), st_bytes(header, std::string(12, '\0')));
  auto f = SafetensorsFile::open(path("t.safetensors"));
  EXPECT_EQ(f.load("f", DType::f32, "t").get(0), 0.0f);
  try {
    f.load("i", DType::f32, "t");
    FAIL() << "loaded an I64 tensor";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_status(), 2);
    EXPECT_NE(e.message().find("'i' is I64"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("F32, BF16"), std::string::npos) << e.message();
  }
}

TEST_F(Safetensors, UnknownNameIsAUsageErrorListingTheNames) {
  Tensor a = random_tensor({2}, DType::f32, "a");
  write_safetensors(path("t.safetensors"), {{"alpha", &a}});
  try {
    SafetensorsFile::open(path("t.safetensors")).load("beta", DType::f32, "t");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_status(), 2);
    EXPECT_NE(e.message().find("'beta'"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("alpha"), std::string::npos) << e.message();
  }
}

TEST_F(Safetensors, MissingFileOrADirectoryIsAUsageErrorNamingIt) {
  for (const std::string& p : {path("absent.safetensors"), tmp_.dir().string()}) {
    try {
      SafetensorsFile::open(p);
      ADD_FAILURE() << p;
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_status(), 2);
      EXPECT_EQ(e.message().rfind(p + ": ", 0), 0u) << e.message();
    }
  }
}

TEST_F(Safetensors, RefusesToWriteDuplicateNamesOrToAnUnwritablePath) {
  Tensor a = random_tensor({2}, DType::f32, "a");
  EXPECT_THROW(write_safetensors(path("t.safetensors"), {{"a", &a}, {"a", &a}}), Error);
  EXPECT_THROW(write_safetensors(path("t.safetensors"), {{"__metadata__", &a}}), Error);
  write_file(path("plain"), "x");
  try {
    write_safetensors(path("plain") + "/t.safetensors", {{"a", &a}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_status(), 2);
    EXPECT_NE(e.message().find("plain/t.safetensors"), std::string::npos) << e.message();
  }
}

namespace {
struct Malformed {
  const char* what;
  std::string bytes;
  const char* message;  // a substring the error must contain
};

std::string entry(const std::string& name, const std::string& body) {
  return "\"" + name + "\":{" + body + "}";
}
std::string one(const std::string& body, int data_bytes) {
  return st_bytes("{" + entry("w", body) + "}", std::string(size_t(data_bytes), '\0'));
}
const std::string kOk = R"("dtype":"F32","shape":[2])";

std::vector<Malformed> malformed_files() {
  std::string huge(8, '\0');
  uint64_t n = 200'000'000;
  std::memcpy(huge.data(), &n, 8);
  std::string deep = std::string(20, '[') + std::string(20, ']');
  return {
      {"empty file", "", "too short"},
      {"shorter than the length field", "abcd", "too short"},
      {"header longer than the file", std::string(1, char(100)) + std::string(7, '\0') + "{}",
       "larger than"},
      {"absurd header length", huge + "{}", "exceeds the limit"},
      {"empty header", st_bytes("", ""), "not valid JSON"},
      {"header not JSON", st_bytes("{\"w\":", ""), "not valid JSON"},
      {"header not UTF-8", st_bytes("{\"\xff\":1}", ""), "not valid JSON"},
      {"header an array", st_bytes("[1,2]", ""), "not an object"},
      {"header nested absurdly", st_bytes(deep, ""), "nested deeper"},
      {"entry not an object", st_bytes(R"({"w":5})", ""), "not an object with dtype"},
      {"missing dtype", one(R"("shape":[2],"data_offsets":[0,8])", 8), "has no 'dtype'"},
      {"missing shape", one(R"("dtype":"F32","data_offsets":[0,8])", 8), "has no 'shape'"},
      {"missing data_offsets", one(R"("dtype":"F32","shape":[2])", 8), "has no 'data_offsets'"},
      {"dtype not a string", one(R"("dtype":4,"shape":[2],"data_offsets":[0,8])", 8),
       "not a string"},
      {"unknown dtype", one(R"("dtype":"F33","shape":[2],"data_offsets":[0,8])", 8),
       "unknown dtype 'F33'"},
      {"shape not an array", one(R"("dtype":"F32","shape":2,"data_offsets":[0,8])", 8),
       "not an array"},
      {"negative dimension", one(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])", 8),
       "is negative"},
      {"fractional dimension", one(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])", 8),
       "not an integer"},
      {"dimension beyond int64",
       one(R"("dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,8])", 8),
       "out of range"},
      {"element count overflows",
       one(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8])", 8),
       "overflows"},
      {"byte count overflows",
       one(R"("dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8])", 8), "overflows"},
      {"rank above the limit",
       one(R"("dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,2],"data_offsets":[0,8])",
           8),
       "at most 32"},
      {"data_offsets not a pair", one(kOk + R"(,"data_offsets":[0])", 8),
       "not an array [begin, end]"},
      {"data_offsets fractional", one(kOk + R"(,"data_offsets":[0,8.0])", 8), "not an integer"},
      {"data_offsets negative", one(kOk + R"(,"data_offsets":[-8,0])", 8), "is negative"},
      {"begin after end", one(kOk + R"(,"data_offsets":[8,0])", 8), "begin after end"},
      {"offsets beyond the data", one(kOk + R"(,"data_offsets":[0,8])", 4),
       "beyond the 4-byte data section"},
      {"size not numel times dtype size", one(kOk + R"(,"data_offsets":[0,4])", 4),
       "needs 8 bytes"},
      {"overlapping tensors",
       st_bytes("{" + entry("a", kOk + R"(,"data_offsets":[0,8])") + "," +
                    entry("b", kOk + R"(,"data_offsets":[4,12])") + "}",
                std::string(12, '\0')),
       "overlaps tensor 'a'"},
      {"gap between tensors",
       st_bytes("{" + entry("a", R"("dtype":"F32","shape":[1],"data_offsets":[0,4])") + "," +
                    entry("b", R"("dtype":"F32","shape":[1],"data_offsets":[8,12])") + "}",
                std::string(12, '\0')),
       "gap of 4 bytes before tensor 'b'"},
      {"gap before the first tensor", one(kOk + R"(,"data_offsets":[4,12])", 12), "gap of 4 bytes"},
      {"trailing bytes", one(kOk + R"(,"data_offsets":[0,8])", 9), "1 bytes after the last tensor"},
      {"duplicate tensor name",
       st_bytes("{" + entry("a", kOk + R"(,"data_offsets":[0,8])") + "," +
                    entry("a", kOk + R"(,"data_offsets":[0,8])") + "}",
                std::string(8, '\0')),
       "duplicate key \"a\""},
      {"duplicate key inside an entry", one(kOk + R"(,"dtype":"F32","data_offsets":[0,8])", 8),
       "duplicate key \"dtype\""},
      {"metadata not an object", st_bytes(R"({"__metadata__":[1]})", ""),
       "__metadata__ is a JSON array"},
      {"metadata value not a string", st_bytes(R"({"__metadata__":{"k":1}})", ""),
       "value 'k' is a JSON number"},
  };
}
}  // namespace

TEST_F(Safetensors, RejectsEveryMalformedFileWithAUsageErrorNamingTheProblem) {
  for (const auto& m : malformed_files()) {
    SCOPED_TRACE(m.what);
    const std::string file = path("bad.safetensors");
    write_file(file, m.bytes);
    for (int in_memory = 0; in_memory < 2; ++in_memory) {
      try {
        if (in_memory)
          SafetensorsFile::from_bytes(m.bytes, file);
        else
          SafetensorsFile::open(file);
        ADD_FAILURE() << "accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.exit_status(), 2);
        EXPECT_NE(e.message().find(m.message), std::string::npos) << e.message();
        EXPECT_EQ(e.message().rfind(file, 0), 0u)
            << "the message starts with the file: " << e.message();
        EXPECT_EQ(e.message().find('\n'), std::string::npos) << "one line: " << e.message();
      }
    }
  }
}

TEST_F(Safetensors, HeaderLengthLargerThanTheFileIsRejected) {
  std::string bytes =
      st_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  bytes[0] = char(uint8_t(bytes[0]) + 8);  // claims 8 more header bytes than there are
  write_file(path("t.safetensors"), bytes.substr(0, bytes.size() - 1));
  try {
    SafetensorsFile::open(path("t.safetensors"));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("larger than"), std::string::npos) << e.message();
  }
}

// A stand-in for the fuzzer: every prefix of a valid file, and many randomly corrupted copies,
// either open (then every tensor loads) or raise a usage error — nothing else.
TEST_F(Safetensors, SurvivesEveryTruncationAndRandomCorruption) {
  Tensor a = random_tensor({3, 2}, DType::f32, "a");
  Tensor b = random_tensor({5}, DType::bf16, "b");
  write_safetensors(path("t.safetensors"), {{"a", &a}, {"b", &b}}, {{"format", "pt"}});
  const std::string good = read_file(path("t.safetensors"));
  auto attempt = [&](const std::string& bytes) {
    try {
      auto f = SafetensorsFile::from_bytes(bytes, "fuzz");
      for (const auto& name : f.names()) {
        try {
          f.load(name, DType::f32, "t");
        } catch (const Error& e) {
          EXPECT_EQ(e.exit_status(), 2) << e.message();
        }
      }
      return true;
    } catch (const Error& e) {
      EXPECT_EQ(e.exit_status(), 2) << e.message();
      return false;
    }
  };
  EXPECT_TRUE(attempt(good));
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_FALSE(attempt(good.substr(0, n))) << "prefix of " << n << " bytes";
  std::mt19937 rng(12345);
  for (int trial = 0; trial < 4000; ++trial) {
    std::string bytes = good;
    const int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) bytes[rng() % bytes.size()] = char(rng() % 256);
    attempt(bytes);
  }
}
