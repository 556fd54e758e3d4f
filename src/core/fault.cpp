#include "laga/core/fault.hpp"

#include <atomic>
#include <csignal>
#include <chrono>
#include <thread>
#include <cstring>
#include <iterator>

#include "laga/core/error.hpp"

namespace laga {

namespace {
std::atomic<int> g_rank{-1};
std::atomic<int> g_place{0};  // 0 none, else 1 + index in kPlaces
constexpr const char* kPlaces[] = {"forward",   "backward", "nan-x", "nan-dy",
                                   "inf-wkv_b", "stall",    "kill",  "slow"};
int place_id(const char* p) {
  for (int i = 0; i < int(std::size(kPlaces)); ++i)
    if (std::strcmp(p, kPlaces[i]) == 0) return i + 1;
  return 0;
}
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
             "--inject-fault '{}' is not RANK:PLACE; PLACE is forward, backward, stall, slow, "
             "kill, nan-x, nan-dy or inf-wkv_b (e.g. 2:forward)",
             spec);
  g_rank = rank;
  g_place = place_id(place.c_str());
}

bool poison_point(const char* place, int rank) {
  return g_rank.load(std::memory_order_relaxed) == rank &&
         g_place.load(std::memory_order_relaxed) == place_id(place);
}

void fault_point(const char* place, int rank) {
  if (std::strcmp(place, "forward") == 0 && poison_point("stall", rank)) {
    // A rank that stops answering for a while: the others' collectives must time out (--timeout).
    std::this_thread::sleep_for(std::chrono::seconds(10));
    return;
  }
  if (std::strcmp(place, "forward") == 0 && poison_point("slow", rank)) {
    // A rank the host slows: 50 ms more in each layer's forward, which the others wait for in their
    // next collective (bench's skew column).
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return;
  }
  // as if the OOM killer came
  if (std::strcmp(place, "forward") == 0 && poison_point("kill", rank)) std::raise(SIGKILL);
  if (g_rank.load(std::memory_order_relaxed) != rank ||
      g_place.load(std::memory_order_relaxed) != place_id(place))
    return;
  throw Error(ErrorKind::failure, __FILE__, __LINE__,
              fmt::format("injected fault in {} on rank {}", place, rank));
}

}  // namespace laga
