#include "laga/core/bytes.hpp"

#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>

#include "laga/core/error.hpp"

namespace laga {

int64_t parse_bytes(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  std::string number = text.substr(0, i), unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double v = 0;
  bool ok = !number.empty();
  if (ok) {
    try {
      size_t used = 0;
      v = std::stod(number, &used);
      ok = used == number.size();
    } catch (const std::exception&) {
      ok = false;
    }
  }
  double scale = 0;
  const std::pair<const char*, double> units[] = {{"", 1},
                                                  {"B", 1},
                                                  {"KB", 1e3},
                                                  {"MB", 1e6},
                                                  {"GB", 1e9},
                                                  {"TB", 1e12},
                                                  {"KiB", 1024.0},
                                                  {"MiB", 1048576.0},
                                                  {"GiB", 1073741824.0},
                                                  {"TiB", 1099511627776.0}};
  for (const auto& [name, s] : units)
    if (unit == name) scale = s;
  LAGA_CHECK(ok && scale > 0 && std::isfinite(v * scale) && v * scale < 9.2e18,
             "size '{}' is not a byte count; write e.g. 1GB, 512MiB, 64KiB or 1234567", text);
  return int64_t(std::llround(v * scale));
}

namespace {
// The field `key` ("VmHWM:") of a /proc file of "Key: N kB" lines, in bytes; −1 when it is absent
// or the file cannot be read.
int64_t proc_kib_field(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string word;
  while (in >> word) {
    if (word == key) {
      int64_t kib = -1;
      in >> kib;
      return kib < 0 ? -1 : kib * 1024;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return -1;
}
}  // namespace

int64_t available_memory_bytes() {
  const int64_t bytes = proc_kib_field("/proc/meminfo", "MemAvailable:");
  if (bytes >= 0) return bytes;
  LAGA_FAIL_USAGE(
      "cannot read MemAvailable from /proc/meminfo; give --mem-limit explicitly, e.g. --mem-limit "
      "16GiB");
}

int64_t peak_rss_bytes() {
  const int64_t bytes = proc_kib_field("/proc/self/status", "VmHWM:");
  LAGA_ASSERT(bytes >= 0, "cannot read VmHWM from /proc/self/status");
  return bytes;
}

int64_t anon_huge_page_bytes() {
  return proc_kib_field("/proc/self/smaps_rollup", "AnonHugePages:");
}

}  // namespace laga
