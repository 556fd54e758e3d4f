// laga bench's timed rounds (bench.hpp): per T, --warmup untimed rounds, then --iters timed rounds;
// each round runs every form once in turn. An iteration's figures: per phase the slowest rank's
// time, gathered to the group's rank 0 with its profile and its attention collectives.
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "bench.hpp"
#include "laga/core/work.hpp"

namespace laga::cli {

namespace {

// The attention collectives of one rank's ledger, by tensor name ("q", "latent", "dq", ...).
nlohmann::json rank_collectives(const std::vector<CollectiveRecord>& recs) {
  std::map<std::string, CollStat> by;
  for (const auto& r : recs) {
    if (is_grad_sync(r)) continue;
    std::string key = r.tensor;
    if (by.count(key) && by[key].op != collective_name(r.op))
      key += "@" + std::string(collective_name(r.op));
    CollStat& s = by[key];
    s.op = collective_name(r.op);
    s.count += 1, s.tensor_bytes += r.tensor_bytes, s.wire_bytes += r.wire_bytes;
    s.seconds += r.seconds, s.exposed += r.wait_s, s.hidden += std::max(0.0, r.seconds - r.wait_s);
  }
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, s] : by)
    j[k] = {s.op, s.count, s.tensor_bytes, s.wire_bytes, s.seconds, s.exposed, s.hidden};
  return j;
}

// One rank's figures of one run, as rank 0 gathers them.
nlohmann::json rank_figures(const RankResult& r) {
  double all_s = 0, wait_s = 0;
  std::vector<double> waits;  // per attention collective, in issue order (the same on every rank)
  for (const auto& rec : r.collectives)
    if (!is_grad_sync(rec)) all_s += rec.seconds, wait_s += rec.wait_s, waits.push_back(rec.wait_s);
  return {{"fwd", r.forward_s},
          {"bwd", r.backward_s},
          {"wait", wait_s},
          {"all", all_s},
          {"threads", omp_get_max_threads()},
          {"coll", rank_collectives(r.collectives)},
          {"profile", r.work.to_json()},
          {"other", r.forward_s + r.backward_s - wait_s - r.work.seconds()},
          {"waits", waits}};
}

// Every rank's figures (rank_figures) folded into the slowest rank's of each.
Sample slowest_of(const std::vector<nlohmann::json>& all) {
  Sample s;
  std::vector<std::vector<double>> waits_by_rank;
  for (const auto& j : all) waits_by_rank.push_back(j["waits"].get<std::vector<double>>());
  s.skew = peer_wait_skew(waits_by_rank);
  for (const auto& j : all) {
    s.fwd = std::max(s.fwd, j["fwd"].get<double>()),
    s.bwd = std::max(s.bwd, j["bwd"].get<double>());
    s.exposed = std::max(s.exposed, j["wait"].get<double>());
    s.collective = std::max(s.collective, j["all"].get<double>());
    s.hidden = std::max(s.hidden, std::max(0.0, j["all"].get<double>() - j["wait"].get<double>()));
    for (WorkClass op : kWorkClasses) {
      double& m = s.op_s[work_class_name(op)];
      m = std::max(m, j["profile"][work_class_name(op)]["seconds"].get<double>());
    }
    s.other_s = std::max(s.other_s, j["other"].get<double>());
    if (s.profile.is_null()) s.profile = j["profile"];
    s.threads_min = std::min(s.threads_min, j["threads"].get<int>());
    s.threads_max = std::max(s.threads_max, j["threads"].get<int>());
    for (const auto& [name, v] : j["coll"].items()) {
      CollStat& m = s.coll[name];
      m.op = v[0].get<std::string>();
      m.count = std::max(m.count, v[1].get<int64_t>());
      m.tensor_bytes = std::max(m.tensor_bytes, v[2].get<int64_t>());
      m.wire_bytes = std::max(m.wire_bytes, v[3].get<int64_t>());
      m.seconds = std::max(m.seconds, v[4].get<double>());
      m.exposed = std::max(m.exposed, v[5].get<double>());
      m.hidden = std::max(m.hidden, v[6].get<double>());
    }
  }
  return s;
}

// One timed run of c on every rank of a group; the slowest rank's figures, on the group's rank 0.
Sample timed_run(Launcher& launcher, const Config& c, const RunOptions& opt, double timeout_s) {
  Sample s;
  launcher.run(
      int(c->sp),
      [&](Communicator& comm) {
        const RankResult r = run_rank(c, opt, comm);
        const std::vector<nlohmann::json> all = gather_json(comm, rank_figures(r));
        if (comm.rank() == 0) s = slowest_of(all);
      },
      timeout_s);
  return s;
}

}  // namespace

Progress::Progress(bool root)
    : on_(root && isatty(STDERR_FILENO)), t0_(std::chrono::steady_clock::now()) {}

void Progress::show(int64_t T, const std::string& form, const std::string& what) const {
  if (!on_) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  std::fprintf(stderr, "\r\033[Kbench: T %lld %s %s, %.1f s elapsed", (long long)T, form.c_str(),
               what.c_str(), s);
  std::fflush(stderr);
}

void Progress::done() const {
  if (on_) std::fprintf(stderr, "\r\033[K"), std::fflush(stderr);
}

void timed_rounds(const BenchSetup& s, size_t si, const BenchFlags& b, const CommonFlags& f,
                  Launcher& launcher, const Progress& progress,
                  std::vector<std::vector<Sample>>& samples) {
  RunOptions opt;
  opt.seed = f.seed;
  opt.grad_sync = false;
  for (int64_t it = 0; it < b.warmup + b.iters; ++it)
    for (size_t fi = 0; fi < s.nf; ++fi) {
      progress.show(s.seqs[si], s.keys[fi],
                    it < b.warmup ? fmt::format("warm-up {}/{}", it + 1, b.warmup)
                                  : fmt::format("iteration {}/{}", it - b.warmup + 1, b.iters));
      const Sample x = timed_run(launcher, s.config(si, fi), opt, f.timeout_s);
      if (it >= b.warmup) samples[fi].push_back(x);
    }
}

}  // namespace laga::cli
