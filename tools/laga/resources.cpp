// The resource directory of the laga binary (resources.hpp has the rule).
#include "resources.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "laga/core/error.hpp"

namespace laga::cli {

namespace {
std::string& self_exe_override() {
  static std::string path;
  return path;
}
}  // namespace

void set_self_exe(std::string path) { self_exe_override() = std::move(path); }

std::string self_exe() {
  if (!self_exe_override().empty()) return self_exe_override();
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  LAGA_CHECK(n > 0, "laga report: cannot find its own binary (/proc/self/exe: {})",
             std::strerror(errno));
  return std::string(buf, size_t(n));
}

std::string resource_dir(const std::string& needed) {
  const std::filesystem::path exe = self_exe();
  const std::string dir = (exe.parent_path().parent_path() / "share" / "laga").string();
  std::error_code ec;
  LAGA_CHECK(std::filesystem::exists(dir + "/" + needed, ec),
             "laga: its resources are missing: no {} in {} (found relative to the binary {}: "
             "<its directory>/../share/laga); install laga with cmake --install, or rebuild the "
             "build tree",
             needed, dir, exe.string());
  return dir;
}

std::string python_package_dir() {
  const std::filesystem::path root = std::filesystem::path(self_exe()).parent_path().parent_path();
  std::error_code ec;
  for (const char* dir : {"python", "lib/python3/dist-packages"})
    if (std::filesystem::exists(root / dir / "laga" / "__init__.py", ec))
      return (root / dir).string();
  return "";
}

}  // namespace laga::cli
