#include "laga/core/machine.hpp"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace laga {

namespace {

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  const size_t b = s.find_last_not_of(" \t");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

}  // namespace

MachineInfo machine_info() {
  MachineInfo m;
  char host[256] = {};
  m.host = gethostname(host, sizeof host - 1) == 0 ? host : "unknown";
  m.cpu_model = "unknown";
  std::set<std::string> flags;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (key == "model name" && m.cpu_model == "unknown") m.cpu_model = value;
    if (key == "flags" && flags.empty()) {
      std::istringstream words(value);
      for (std::string w; words >> w;) flags.insert(w);
    }
  }
  for (const char* f : {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    if (flags.count(f)) m.features += (m.features.empty() ? "" : " ") + std::string(f);
  m.online = int(sysconf(_SC_NPROCESSORS_ONLN));
  m.cores = usable_cores();
  m.commit = build_commit();
  m.isa = isa_info();
  return m;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return std::max(1, int(sysconf(_SC_NPROCESSORS_ONLN)));
}

std::string MachineInfo::line() const {
  const std::string n =
      cores < online ? fmt::format("{} of {}", cores, online) : std::to_string(cores);
  return fmt::format("{}, {} ({} cores; {}), ISA: {}, commit {}", host, cpu_model, n,
                     features.empty() ? "no avx512" : features, isa.line(), commit);
}

nlohmann::json MachineInfo::to_json() const {
  return {{"host", host},           {"cpu_model", cpu_model}, {"cores", cores},
          {"online_cores", online}, {"features", features},   {"commit", commit},
          {"isa", isa.to_json()}};
}

}  // namespace laga
