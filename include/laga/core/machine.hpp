// What a measurement ran on and was built from, for the headers of benchmarks and reports: the
// host, the CPU model as the kernel names it, the cores this process may use, the instruction-set
// features that decide the matmul rate (avx512_bf16, amx_bf16), the ISA laga's kernels use
// (core/isa.hpp), and the commit of the build.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

#include "laga/core/isa.hpp"

namespace laga {

struct MachineInfo {
  std::string host;  // gethostname
  // /proc/cpuinfo "model name" (e.g. "AMD EPYC 9R14 96-Core Processor"); "unknown" elsewhere
  std::string cpu_model;
  // CPUs this process may run on (sched_getaffinity: 1 for an MPI rank bound to a core)
  int cores = 0;
  int online = 0;  // CPUs the machine has online (sysconf)
  // the ones present of: avx512f avx512_bf16 amx_bf16 amx_tile ("" when none)
  std::string features;
  std::string commit;  // build_commit()
  IsaInfo isa;         // the kernels' ISA in use, under LAGA_MAX_ISA
  // "HOST, CPU (N cores; features), ISA: rows T, matmul I (bf16 ...), LAGA_MAX_ISA c, commit C";
  // "(1 of 2 cores; ...)" when this process may use fewer than the machine has.
  std::string line() const;
  nlohmann::json to_json() const;
};

MachineInfo machine_info();
// The CPUs this process may run on (sched_getaffinity; the online count where that fails): what a
// rank's OpenMP threads are sized from. Not std::thread::hardware_concurrency(), which counts every
// CPU of the machine: a rank bound to one core (mpirun's binding, scripts/link.sh's taskset) would
// run several threads on it.
int usable_cores();
// `git describe --always --dirty` of the source tree when this binary was built; "unknown" outside
// git.
const char* build_commit();

}  // namespace laga
