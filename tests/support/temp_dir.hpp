// A fresh, empty directory for one GoogleTest, removed when the test ends. Its name holds the
// process id and the running test's name, so tests that CTest runs in parallel processes never
// share one.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace laga::testing {

class TempDir {
 public:
  // <temp>/laga-<prefix>-<pid>-<test name>, emptied and created.
  explicit TempDir(const std::string& prefix) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           fmt::format("laga-{}-{}-{}", prefix, ::getpid(), info ? info->name() : "no-test");
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  ~TempDir() {
    std::error_code ec;  // a destructor does not throw
    std::filesystem::remove_all(dir_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

 private:
  std::filesystem::path dir_;
};

}  // namespace laga::testing
