// Fault injection for tests of failure handling: `laga run --inject-fault RANK:PLACE` makes rank
// RANK throw a laga::Error (failure) when it reaches PLACE ("forward" or "backward", in the first
// layer, after the form's collectives have started). Off unless set; a single relaxed check per layer.
#pragma once

#include <string>

namespace laga {

// Parses "RANK:PLACE"; usage error naming the value otherwise.
void set_injected_fault(const std::string& spec);
// Throws if the injected fault names this rank and place.
void fault_point(const char* place, int rank);

}  // namespace laga
