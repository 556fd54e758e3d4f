#include "laga/core/fault.hpp"

#include <atomic>
#include <cstring>

#include "laga/core/error.hpp"

namespace laga {

namespace {
std::atomic<int> g_rank{-1};
std::atomic<int> g_place{0};  // 0 none, 1 forward, 2 backward
int place_id(const char* p) { return std::strcmp(p, "forward") == 0 ? 1 : std::strcmp(p, "backward") == 0 ? 2 : 0; }
}  // namespace

void set_injected_fault(const std::string& spec) {
  auto colon = spec.find(':');
  int rank = -1;
  std::string place = colon == std::string::npos ? "" : spec.substr(colon + 1);
  try {
    if (colon != std::string::npos) rank = std::stoi(spec.substr(0, colon));
  } catch (const std::exception&) {
    rank = -1;
  }
  LAGA_CHECK(rank >= 0 && place_id(place.c_str()) != 0,
             "--inject-fault '{}' is not RANK:PLACE; e.g. 2:forward or 0:backward", spec);
  g_rank = rank;
  g_place = place_id(place.c_str());
}

void fault_point(const char* place, int rank) {
  if (g_rank.load(std::memory_order_relaxed) != rank || g_place.load(std::memory_order_relaxed) != place_id(place)) return;
  throw Error(ErrorKind::failure, __FILE__, __LINE__, fmt::format("injected fault in {} on rank {}", place, rank));
}

}  // namespace laga
