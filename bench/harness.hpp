// The benchmark harness every bench/bench_*.cpp shares (nccl-tests style): warm-up then timed
// repeats reported as median and spread (min, max, interquartile range); a table whose `#` header
// names the machine, thread count, dtype(s) and git commit, with a units row and a `#wrong` column;
// the same rows as JSON beside it (--json FILE); and a non-zero exit when any result was wrong.
// Benchmarks validate before they report: a row carries its own count of wrong values.
// It holds no benchmark itself, and no timing ever goes into a test.
#pragma once

#include <omp.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <limits>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <variant>
#include <vector>

#include "laga/core/error.hpp"
#include "laga/core/isa.hpp"
#include "laga/core/machine.hpp"

namespace laga::bench {

// ---- timing
// ----------------------------------------------------------------------------------------

struct Timing {
  double median_s = 0, min_s = 0, max_s = 0, q1_s = 0, q3_s = 0;
  int repeats = 0;
};

inline Timing summarize(std::vector<double> seconds) {
  LAGA_ASSERT(!seconds.empty(), "no timings to summarize");
  std::sort(seconds.begin(), seconds.end());
  auto quantile = [&](double f) {  // linear interpolation between order statistics
    const double x = f * double(seconds.size() - 1);
    const size_t i = size_t(x);
    const double w = x - double(i);
    return i + 1 < seconds.size() ? seconds[i] * (1 - w) + seconds[i + 1] * w : seconds[i];
  };
  return {quantile(0.5),  seconds.front(), seconds.back(),
          quantile(0.25), quantile(0.75),  int(seconds.size())};
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Runs f() `warmup` times untimed, then `repeats` times timed.
template <class F>
Timing time_it(F&& f, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    const double t0 = now_s();
    f();
    t.push_back(now_s() - t0);
  }
  return summarize(t);
}

// ---- the machine and the build ------------------------------------------------------------------

// The table's view of laga's MachineInfo (core/machine.hpp), the one description of the machine.
struct Machine {
  std::string cpu;     // model name, plus the vector/matrix extensions that matter here
  int threads = 0;     // OpenMP threads a parallel region gets
  std::string commit;  // the commit of the build (build_commit), or "unknown"
  std::string host;
  std::string isa;  // the kernels' ISA in use (core/isa.hpp)
};

inline Machine machine() {
  const MachineInfo mi = machine_info();
  Machine m;
  m.cpu = mi.cpu_model;
  const std::string features = " " + mi.features + " ";
  for (const char* ext : {"avx512f", "avx512_bf16", "amx_bf16"})
    if (features.find(std::string(" ") + ext + " ") != std::string::npos)
      m.cpu += std::string(" +") + ext;
  m.threads = omp_get_max_threads();
  m.commit = mi.commit;
  m.host = mi.host;
  m.isa = mi.isa.line();
  return m;
}

// ---- options
// ---------------------------------------------------------------------------------------

// The whole number `text` given to `option`, or a usage error (exit 2) naming both; std::stoll
// would read "12abc" as 12 and throw, uncaught, on "abc". With bounds, a number outside [lo, hi] is
// a usage error too.
inline int64_t whole_number(const std::string& option, const std::string& text,
                            int64_t lo = std::numeric_limits<int64_t>::min(),
                            int64_t hi = std::numeric_limits<int64_t>::max()) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    LAGA_FAIL_USAGE("{} '{}' is not a whole number; give one, e.g. {} 4", option, text, option);
  if (v < lo || v > hi) LAGA_FAIL_USAGE("{} {} must be {} .. {}", option, v, lo, hi);
  return v;
}

struct Options {
  int warmup = 1, repeats = 5;
  std::string json_path;
  std::vector<std::string> rest;  // arguments the benchmark parses itself

  static Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        LAGA_CHECK(i + 1 < argc, "{} needs a value", a);
        return argv[++i];
      };
      if (a == "--warmup")
        o.warmup = int(whole_number(a, value(), 0, 1 << 20));
      else if (a == "--repeats")
        o.repeats = int(whole_number(a, value(), 1, 1 << 20));
      else if (a == "--json")
        o.json_path = value();
      else
        o.rest.push_back(a);
    }
    return o;
  }
};

// ---- the table
// ---------------------------------------------------------------------------------------

struct Column {
  std::string name, unit;  // the unit row; "" for none
  int width = 10;
  int precision = 3;  // for doubles
};
using Cell = std::variant<std::string, double, int64_t>;

class Table {
 public:
  Table(std::string benchmark, std::vector<std::string> header_lines, std::vector<Column> columns)
      : benchmark_(std::move(benchmark)),
        header_(std::move(header_lines)),
        columns_(std::move(columns)) {}

  // Prints the `#` header (machine, threads, commit, the benchmark's own lines) and the column and
  // unit rows. The last column should be `#wrong`.
  void print_header(const Machine& m) const {
    std::printf("# %s\n# machine: %s, host %s, %d OpenMP threads, commit %s\n", benchmark_.c_str(),
                m.cpu.c_str(), m.host.c_str(), m.threads, m.commit.c_str());
    std::printf("# isa: %s\n", m.isa.c_str());
    for (const auto& h : header_) std::printf("# %s\n", h.c_str());
    std::string names = "#", units = "#";
    for (const auto& c : columns_) {
      names += pad(c.name, c.width);
      units += pad(c.unit, c.width);
    }
    std::printf("%s\n%s\n", names.c_str(), units.c_str());
    std::fflush(stdout);
  }

  // Prints one row and keeps it for the JSON; wrong counts the row's invalid values.
  void row(const std::vector<Cell>& cells, int64_t wrong) {
    LAGA_ASSERT(cells.size() + 1 == columns_.size(), "row of {} cells for {} columns (+ #wrong)",
                cells.size(), columns_.size());
    std::string line = " ";
    nlohmann::json j;
    for (size_t i = 0; i < cells.size(); ++i) {
      const Column& c = columns_[i];
      std::visit(
          [&](const auto& v) {
            using V = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<V, std::string>)
              line += pad(v, c.width);
            else if constexpr (std::is_same_v<V, double>)
              line += pad(fmt::format("{:.{}f}", v, c.precision), c.width);
            else
              line += pad(std::to_string(v), c.width);
            j[c.name] = v;
          },
          cells[i]);
    }
    line += pad(std::to_string(wrong), columns_.back().width);
    j["wrong"] = wrong;
    rows_.push_back(j);
    wrong_ += wrong;
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  int64_t wrong() const { return wrong_; }

  // Writes {benchmark, machine, header, rows, pass} to path (if not empty); returns the exit
  // status: 0 when every value validated, 1 otherwise.
  int finish(const Machine& m, const std::string& path, const nlohmann::json& extra = {}) const {
    std::printf("# %s: %lld wrong values\n", wrong_ ? "FAILED" : "all results validated",
                (long long)wrong_);
    if (!path.empty()) {
      nlohmann::json j = {{"benchmark", benchmark_},
                          {"machine",
                           {{"cpu", m.cpu},
                            {"host", m.host},
                            {"threads", m.threads},
                            {"commit", m.commit},
                            {"isa", m.isa}}},
                          {"header", header_},
                          {"rows", rows_},
                          {"pass", wrong_ == 0}};
      if (!extra.is_null()) j["config"] = extra;
      std::ofstream f(path);
      LAGA_CHECK(f.good(), "cannot write --json {}", path);
      f << j.dump(2) << "\n";
    }
    return wrong_ ? 1 : 0;
  }

 private:
  static std::string pad(const std::string& s, int width) {
    return s.size() >= size_t(width) ? " " + s : std::string(size_t(width) - s.size(), ' ') + s;
  }
  std::string benchmark_;
  std::vector<std::string> header_;
  std::vector<Column> columns_;
  std::vector<nlohmann::json> rows_;
  int64_t wrong_ = 0;
};

}  // namespace laga::bench
