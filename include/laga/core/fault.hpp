// Fault injection for tests of failure handling: `laga run --inject-fault RANK:PLACE` makes rank
// RANK throw a laga::Error (failure) when it reaches PLACE ("forward" or "backward", in the first
// layer, after the form's collectives have started), stops answering for 10 s in forward ("stall",
// for --timeout), sleeps 50 ms in each layer's forward ("slow", as a busy host would take the time:
// the others wait for it, bench's skew), kills its process with SIGKILL in forward ("kill"), or
// poisons one value of its input with a NaN
// ("nan-x", "nan-dy") or of one weight with an Inf ("inf-wkv_b"), for --check-finite. Off unless
// set; a single relaxed check per layer.
#pragma once

#include <string>

namespace laga {

// Parses "RANK:PLACE"; usage error naming the value otherwise.
void set_injected_fault(const std::string& spec);
// Throws if the injected fault names this rank and place.
void fault_point(const char* place, int rank);
// True if the injected fault poisons `place` ("nan-x", "nan-dy", "inf-wkv_b") on this rank.
bool poison_point(const char* place, int rank);

}  // namespace laga
