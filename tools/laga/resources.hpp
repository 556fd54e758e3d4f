// Where the laga binary finds what it runs besides itself (laga report's scripts/report.py,
// scripts/link.sh, tests/torch/mla_block_torch.py, examples/train_lm.py and the hardware files
// docs/hw/*.json): one rule, relative to the running binary, never to the source tree it was built
// from.
//
//   resources = <directory of /proc/self/exe>/../share/laga, holding the same relative paths as the
//   source tree (scripts/report.py, docs/hw/ascend-910b.json, ...).
//
// Installed (cmake --install build --prefix DIR), the binary is DIR/bin/laga and the resources
// DIR/share/laga. The build tree has the same layout: the binary is build/bin/laga (build/laga a
// symbolic link to it; /proc/self/exe names the file it resolves to) and the build copies the
// resources to build/share/laga (CMakeLists.txt: LAGA_RESOURCES, the list both use). Missing
// resources are an error naming the directory looked in, never a fallback elsewhere.
//
// The Python package (for laga report's examples/train_lm.py) is found by the rule of the package's
// own _binary() (python/laga/__init__.py) read backwards: <directory of the binary>/../python in
// the build tree (build/python/laga), <directory of the binary>/../lib/python3/dist-packages
// installed (DIR/lib/python3/dist-packages/laga).
#pragma once

#include <string>

namespace laga::cli {

// The absolute path of this binary (/proc/self/exe), or the one set_self_exe named.
std::string self_exe();
// For a process that runs the commands without being the laga binary (the Python package): the
// binary whose place defines the resources (build/bin/laga, DIR/bin/laga). Empty: /proc/self/exe.
void set_self_exe(std::string path);
// The resource directory of this binary, checked to hold `needed` (a path relative to it); a usage
// error naming the directory when it does not.
std::string resource_dir(const std::string& needed);
// The directory holding the laga Python package (laga/__init__.py) beside this binary, for a
// PYTHONPATH; empty when neither place holds it (built without the package, or installed
// elsewhere).
std::string python_package_dir();

}  // namespace laga::cli
