// laga report --out DIR [--quick]: every measurement of the project in one run, written beside the
// paper's figures. Each step is this binary (or mpirun, scripts/link.sh, examples/train_lm.py) run
// as a subprocess with its JSON and its log in DIR; steps.json records what ran, how long, and how
// it ended. Then scripts/report.py (matplotlib, under /usr/bin/python3) writes DIR/report.md and
// its plots from those JSON files alone. A step that fails is recorded and the report goes on; the
// exit status is 1 if any step failed. The link steps run only as root with network namespaces;
// otherwise they are recorded as skipped with link.sh's reason. What each step measures:
// docs/report.md. The scripts and hardware files come from the binary's resource directory
// (resources.hpp); the steps run there. The forms come from the registry (forms_at_config): every
// form that runs a step's configuration, and DIR/forms.json says which step ran which and each
// form's declared kernel. cmd_report composes: the list of steps (report_steps: the measurements,
// the link steps, the model's steps, training, the language model, the repeated timing), running
// them (run_steps), and report.py (write_report).
#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/error.hpp"
#include "laga/driver/model.hpp"
#include "laga/mla/form.hpp"
#include "resources.hpp"

extern char** environ;

namespace laga::cli {

namespace {

// Runs argv with stdout and stderr into log, in cwd; the exit status (128 + signal when killed).
int run_logged(const std::vector<std::string>& argv, const std::string& log,
               const std::string& cwd) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string here = std::filesystem::current_path();
  std::filesystem::current_path(cwd);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  std::filesystem::current_path(here);
  posix_spawn_file_actions_destroy(&fa);
  LAGA_CHECK(rc == 0, "laga report: cannot start {} ({})", argv[0], std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

using Args = std::vector<std::string>;

Args cat(Args a, const Args& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct Step {
  std::string name, title;
  // The command, built when the step starts (a later step may read an earlier one's JSON).
  std::function<Args()> argv;
  // An emulated-link step: exit 2 from link.sh means "not available here" (no root, no namespaces):
  // skipped. Any step that exits 77 was skipped for want of an earlier step's output.
  bool link = false;
};

// What every step is built from: where it writes, what it runs, and the sizes of --quick or not.
// The steps' commands refer to it: it outlives them.
struct Report {
  std::string out;   // DIR, absolute
  std::string res;   // the resource directory (resources.hpp)
  std::string laga;  // this binary
  bool quick = false;
  // One machine: P 2, one core per rank; the small preset (DeepSeek's head dims, H 16).
  std::string seqs, iters;
  // The registered forms each step runs (registry order, forms_at_config): every form that runs
  // the bench's configuration in the fused bench; in the eager bench only those that run the
  // config's kernel (a form with its own kernel, Form::own_kernel, runs the same code in both).
  std::vector<std::string> fused_forms, eager_forms, mpi_forms, link_forms, train_forms;
  // The model's rates are calibrated at every T a bench row runs, and at T 1024 = 2048 / P, the
  // length of the ring forms' kernel calls at the shortest T (a chunk pair of T/(2P) tokens each).
  std::string cal_seqs;
  std::string link_seqs;
  // The configuration timed twice, early and late in the run (bench.repeat.*): how far the host
  // moves one reading in the time between, beside the model's errors.
  std::string repeat_seq = "2048";
  std::string J(const std::string& name) const { return out + "/" + name; }
  std::string hw(const std::string& name) const { return res + "/docs/hw/" + name + ".json"; }
  Args bench(const std::string& kernel, const std::string& json, const std::string& seq_list,
             const std::vector<std::string>& forms) const {
    return {laga,      "bench",     "--model",  "small", "--seq",   seq_list, "--sp",   "2",
            "--forms", join(forms), "--kernel", kernel,  "--iters", iters,    "--json", json};
  }
  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
    return s;
  }
};

// Where a registered form stands at one configuration of the report's: runnable, or its reason.
struct FormsAtConfig {
  std::vector<std::string> runnable;           // registry order
  std::map<std::string, std::string> refused;  // form -> the first reason, at the first T refused
};

// The registered forms that run `model` at P `sp`, kernel `kernel`, dtype `dtype`, at every T of
// seq_list (forms_at, the rule of every command that runs every form).
FormsAtConfig forms_at_config(const std::string& model, int64_t sp, const std::string& kernel,
                              const std::string& dtype, const std::string& seq_list) {
  FormsAtConfig out;
  std::stringstream ss(seq_list);
  for (std::string t; std::getline(ss, t, ',');) {
    CommonFlags g;
    g.model = model, g.sp = sp, g.kernel = kernel, g.dtype = dtype, g.seq = std::stoll(t);
    FormsAt at;
    spec_for_all_forms(g, at);
    for (const auto& why : at.refused)
      out.refused.emplace(std::string(why.form->name()), fmt::format("T {}: {}", t, why.reason));
  }
  for (const Form* f : registered_forms())
    if (!out.refused.count(std::string(f->name()))) out.runnable.emplace_back(f->name());
  return out;
}

// The forms of `all` that run the config's kernel (no Form::own_kernel).
std::vector<std::string> without_own_kernel(const std::vector<std::string>& all) {
  std::vector<std::string> out;
  for (const auto& name : all)
    if (find_form(name).own_kernel().empty()) out.push_back(name);
  return out;
}

Report report_of(const std::string& out_dir, bool quick) {
  Report r;
  std::filesystem::create_directories(out_dir);
  r.out = std::filesystem::absolute(out_dir).string();
  r.res = resource_dir("scripts/report.py");
  r.laga = self_exe();
  r.quick = quick;
  // --quick: every form at one T (its fused bench is the one place every form is timed); the
  // MPI and link benches the paper's pair (explicit, laga) at that T.
  r.seqs = quick ? "2048" : "2048,4096,8192";
  r.cal_seqs = "1024," + r.seqs;
  r.iters = quick ? "2" : "5";
  r.link_seqs = quick ? "2048" : "2048,4096";
  r.fused_forms = forms_at_config("small", 2, "fused", "bf16", r.seqs).runnable;
  r.eager_forms = without_own_kernel(forms_at_config("small", 2, "eager", "bf16", r.seqs).runnable);
  // The paper's pair, where it runs; across the link also the sparse pair (gather or re-gather).
  std::vector<std::string> pair, link_pair;
  for (const auto& name : r.fused_forms) {
    if (name == kBaselineForm || name == "laga") pair.push_back(name);
    if (name == kBaselineForm || name == "laga" || find_form(name).sparse())
      link_pair.push_back(name);
  }
  r.mpi_forms = quick ? pair : r.fused_forms;
  r.link_forms =
      quick ? link_pair : forms_at_config("small", 2, "fused", "bf16", r.link_seqs).runnable;
  r.train_forms = forms_at_config("tiny", 4, "fused", "fp32", "64").runnable;
  return r;
}

// DIR/forms.json: every registered form with its declared properties (the kernel it runs whatever
// --kernel says, where its output lives, its token layout), why it is not run at the bench's
// configuration where it is not, and which forms each step runs. report.py reads a form's kernel
// from here, never from its name.
void write_forms_json(const Report& r) {
  const FormsAtConfig fused = forms_at_config("small", 2, "fused", "bf16", r.seqs);
  nlohmann::json forms = nlohmann::json::array();
  const MlaConfig bench_spec = MlaConfig::preset("small");  // the layouts the benches run
  for (const Form* f : registered_forms()) {
    const std::string name(f->name());
    nlohmann::json j = {{"name", name},
                        {"family", std::string(f->family())},
                        {"summary", std::string(f->summary())},
                        {"own_kernel", std::string(f->own_kernel())},
                        {"output", f->output() == Form::Output::heads ? "heads" : "tokens"},
                        {"layout", std::string(token_layout_name(f->layout(bench_spec)))},
                        {"exact_at_one_rank", f->exact_at_one_rank()},
                        {"sparse", f->sparse()}};
    if (auto it = fused.refused.find(name); it != fused.refused.end())
      j["not_run_at_bench"] = it->second;
    forms.push_back(j);
  }
  std::ofstream(r.J("forms.json"))
      << nlohmann::json{{"forms", forms},
                        {"bench_config", {{"model", "small"}, {"sp", 2}, {"seqs", r.seqs}}},
                        {"steps",
                         {{"bench.threads.fused", r.fused_forms},
                          {"bench.threads.eager", r.eager_forms},
                          {"bench.mpi.fused", r.mpi_forms},
                          {"bench.link", r.link_forms},
                          {"bench.repeat", std::vector<std::string>{std::string(kBaselineForm)}},
                          {"train", r.train_forms}}}}
             .dump(2)
      << "\n";
}

// Across the emulated link (scripts/link.sh, two namespaces, one MPI rank each): the rate matched
// to the paper's two-node setting on this CPU (docs/throughput.md), 4× faster and 4× slower. The
// matched rate keeps link bandwidth over compute rate as in the paper's two nodes: 11 GB/s of RoCE
// over a 910B's achieved bf16 matmul rate (docs/hw/ascend-910b.json), times this machine's, just
// calibrated by model.calibrate (docs/throughput.md). Derived when the first link step starts and
// recorded in link_rates.json; without a calibration the link steps fail, saying why.
struct Rate {
  const char* name;
  double factor;  // × the matched rate
};

// The link rate `factor` × the matched one, for link.sh's --rate; "" when there is no calibration.
std::string link_rate(const Report& r, double factor) {
  // The bf16 matmul rate at the link rows' first T (0 when the file is missing or unreadable: the
  // link steps then fail, saying why).
  const int64_t T = std::stoll(r.link_seqs.substr(0, r.link_seqs.find(',')));
  auto matmul_tflops = [&](const std::string& path) {
    try {
      return HardwareSpec::load(path).compute_for(DType::bf16).matmul_tflops.at(T);
    } catch (const std::exception&) {
      return 0.0;
    }
  };
  const double here = matmul_tflops(r.J("hw.here.json")), npu = matmul_tflops(r.hw("ascend-910b"));
  if (here <= 0 || npu <= 0) return "";
  const double paper_link = 11e9, matched = paper_link * here / npu;  // bytes/s
  std::ofstream(r.J("link_rates.json")) << nlohmann::json{
      {"paper_link_Bps", paper_link},
      {"npu_matmul_tflops", npu},
      {"here_matmul_tflops", here},
      {"seq", T},
      {"matched_Bps", matched}}.dump(2);
  return fmt::format("{}kbit", std::llround(matched * factor * 8 / 1000));
}

// args run across the emulated link at `factor` × the matched rate.
Args over_link(const Report& r, double factor, const Args& args) {
  const std::string rate = link_rate(r, factor);
  if (rate.empty())
    return Args{"bash", "-c",
                "echo 'laga report: no calibrated bf16 matmul rate in hw.here.json "
                "(model.calibrate failed?): cannot derive the matched link rate'; exit 1"};
  return cat({"bash", r.res + "/scripts/link.sh", "--ranks", "2", "--rate", rate, "--"}, args);
}

// explicit, fused, T repeat_seq, P 2: the same bench early in the run (`when` "early") and again at
// its end ("late"); the two readings apart say how much the host alone moves a measurement.
Step repeat_step(const Report& r, const std::string& when) {
  return {"bench.repeat." + when,
          fmt::format("explicit, fused, T {}, P 2, timed again {} in the run", r.repeat_seq, when),
          [&r, when] {
            return r.bench("fused", r.J("bench.repeat." + when + ".json"), r.repeat_seq,
                           {std::string(kBaselineForm)});
          }};
}

// The measurements in one machine: verify, the torch check, plan, bench-comm, the calibration and
// bench.
void measurement_steps(const Report& r, std::vector<Step>& steps) {
  const bool quick = r.quick;
  steps.push_back(
      {"verify", "the forms against the fp64 reference (small, bf16, P 1, 2, 4, 8)", [&r, quick] {
         return Args{r.laga, "verify",  "--model", "small",           "--seq", quick ? "64" : "128",
                     "--sp", "1,2,4,8", "--json",  r.J("verify.json")};
       }});
  steps.push_back(
      {"torch", "laga's y, dx and every gradient against PyTorch autograd (small, fp32, P 2, L 2)",
       [&r] {
         const std::string dump = r.J("torch_dump");
         return Args{
             "bash", "-c",
             fmt::format(
                 "set -e; '{}' run --model small --seq 256 --sp 2 --form laga --dtype fp32 "
                 "--layers 2 --dump "
                 "'{}'; /usr/bin/python3 '{}/tests/torch/mla_block_torch.py' '{}'; rm -rf '{}'",
                 r.laga, dump, r.res, dump, dump)};
       }});
  for (const char* kernel : {"fused", "eager"})
    steps.push_back(
        {fmt::format("plan.{}", kernel),
         fmt::format("memory and traffic at DeepSeek-V3, T 16384, P 8, {}", kernel), [&r, kernel] {
           return Args{r.laga,     "plan",  "--model", "deepseek-v3",
                       "--seq",    "16384", "--sp",    "8",
                       "--kernel", kernel,  "--json",  r.J(fmt::format("plan.{}.json", kernel))};
         }});
  // The sparse forms at DeepSeek-V3.2's scale: per-tensor memory and traffic, per-rank work in both
  // layouts.
  for (const auto& tp : {std::pair<const char*, const char*>{"131072", "16"}, {"262144", "64"}}) {
    const char *T = tp.first, *P = tp.second;
    steps.push_back({fmt::format("plan.dsa.t{}.p{}", T, P),
                     fmt::format("the sparse forms at DeepSeek-V3.2, T {}, P {}", T, P),
                     [&r, T, P] {
                       return Args{r.laga,    "plan",
                                   "--model", "deepseek-v3.2",
                                   "--seq",   T,
                                   "--sp",    P,
                                   "--json",  r.J(fmt::format("plan.dsa.t{}.p{}.json", T, P))};
                     }});
  }
  steps.push_back(
      {"plan.sweep", "memory over T × P × kernel and traffic over H (DeepSeek-V3 dims)", [&r] {
         return Args{
             r.laga, "plan", "--sweep", "--model", "deepseek-v3", "--json", r.J("plan_sweep.json")};
       }});
  steps.push_back(
      {"bench-comm.threads", "the collectives in one machine (threads, P 2)", [&r, quick] {
         return Args{r.laga, "bench-comm", "--sp",   "2",
                     "-b",   "4K",         "-e",     quick ? "16M" : "64M",
                     "-f",   "4",          "--json", r.J("bench_comm.threads.json")};
       }});
  // The performance model calibrated on this machine (its rates per operation class, the in-process
  // link from bench-comm), just before the benchmarks it is compared with.
  steps.push_back(
      {"model.calibrate", "the performance model calibrated on this machine (P 2)", [&r] {
         return Args{r.laga,
                     "model",
                     "--calibrate",
                     r.J("hw.here.json"),
                     "--comm-json",
                     r.J("bench_comm.threads.json"),
                     "--sp",
                     "2",
                     "--calibrate-seq",
                     r.cal_seqs};
       }});
  steps.push_back(repeat_step(r, "early"));
  steps.push_back(
      {"bench.threads.fused", "throughput in one machine, threads, fused",
       [&r] { return r.bench("fused", r.J("bench.threads.fused.json"), r.seqs, r.fused_forms); }});
  steps.push_back(
      {"bench.threads.eager", "throughput in one machine, threads, eager",
       [&r] { return r.bench("eager", r.J("bench.threads.eager.json"), r.seqs, r.eager_forms); }});
  // The same ranks as processes under mpirun, over shared memory: its collectives (for the model's
  // link), then the bench.
  const Args mpirun = {
      "mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader", "-np", "2"};
  steps.push_back(
      {"bench-comm.mpi", "the collectives in one machine, MPI over shared memory", [&r, mpirun] {
         return cat(mpirun, {r.laga, "bench-comm", "-b", "4K", "-e", r.quick ? "16M" : "64M", "-f",
                             "4", "--json", r.J("bench_comm.mpi.json")});
       }});
  steps.push_back(
      {"bench.mpi.fused", "throughput in one machine, MPI over shared memory, fused", [&r, mpirun] {
         return cat(mpirun, r.bench("fused", r.J("bench.mpi.fused.json"), r.seqs, r.mpi_forms));
       }});
}

// At each link rate: bench-comm and bench across the link, bench with overlap, and the model
// against both.
void link_steps(const Report& r, std::vector<Step>& steps) {
  std::vector<Rate> rates = {{"matched", 1.0}, {"fast", 4.0}, {"slow", 0.25}};
  if (r.quick) rates.resize(1);
  for (const Rate& rate : rates) {
    const std::string n = rate.name;
    const double k = rate.factor;
    steps.push_back({"bench-comm.link." + n,
                     fmt::format("the collectives across the link at the {} rate", n),
                     [&r, n, k] {
                       return over_link(r, k,
                                        {r.laga, "bench-comm", "-b", "128K", "-e",
                                         r.quick ? "1M" : "4M", "-f", "2", "-n", "5", "--host-cost",
                                         "--json", r.J(fmt::format("bench_comm.link.{}.json", n))});
                     },
                     true});
    steps.push_back(
        {"bench.link." + n, fmt::format("throughput across the link at the {} rate, fused", n),
         [&r, n, k] {
           return over_link(r, k,
                            {r.laga, "bench", "--model", "small", "--seq", r.link_seqs, "--sp", "2",
                             "--forms", Report::join(r.link_forms), "--kernel", "fused", "--iters",
                             r.iters, "--json", r.J(fmt::format("bench.link.{}.json", n))});
         },
         true});
    // The same forms with their collectives overlapped (--overlap on), at every rate.
    steps.push_back({fmt::format("bench.link.{}.overlap", n),
                     fmt::format("throughput across the link at the {} rate, fused, overlap on", n),
                     [&r, n, k] {
                       return over_link(
                           r, k,
                           {r.laga, "bench", "--model", "small", "--seq", r.link_seqs, "--sp", "2",
                            "--forms", Report::join(r.link_forms), "--kernel", "fused", "--iters",
                            r.iters, "--overlap", "on", "--json",
                            r.J(fmt::format("bench.link.{}.overlap.json", n))});
                     },
                     true});
    // The model with this link's bench-comm (compute calibrated again, here), against the link's
    // bench rows without overlap and with it.
    steps.push_back(
        {"model.vs_bench.link." + n,
         fmt::format("the model against the link bench at the {} rate", n), [&r, n] {
           const std::string hw = r.J(fmt::format("hw.link.{}.json", n));
           return Args{
               "bash", "-c",
               fmt::format(
                   "set -e; test -s '{0}' || {{ echo 'no link bench-comm to calibrate from (the "
                   "link "
                   "steps were skipped)'; exit 77; }}; "
                   "'{1}' model --calibrate '{2}' --comm-json '{0}' --sp 2 --calibrate-seq {7}; "
                   "'{1}' model --hw '{2}' --bench-json '{3}' --json '{4}'; "
                   "'{1}' model --hw '{2}' --bench-json '{5}' --json '{6}'",
                   r.J(fmt::format("bench_comm.link.{}.json", n)), r.laga, hw,
                   r.J(fmt::format("bench.link.{}.json", n)),
                   r.J(fmt::format("model.vs_bench.link.{}.json", n)),
                   r.J(fmt::format("bench.link.{}.overlap.json", n)),
                   r.J(fmt::format("model.vs_bench.link.{}.overlap.json", n)),
                   "1024," + r.link_seqs)};
         }});
  }
}

// The model against the one-machine bench rows, at the paper's configurations, and over a grid.
void model_steps(const Report& r, std::vector<Step>& steps) {
  for (const char* kernel : {"fused", "eager"})
    steps.push_back({fmt::format("model.vs_bench.{}", kernel),
                     fmt::format("the model against the {} bench rows", kernel), [&r, kernel] {
                       return Args{
                           r.laga,         "model",
                           "--hw",         r.J("hw.here.json"),
                           "--bench-json", r.J(fmt::format("bench.threads.{}.json", kernel)),
                           "--json",       r.J(fmt::format("model.vs_bench.{}.json", kernel))};
                     }});
  // Under MPI: this machine's compute, the link fitted to the MPI bench-comm.
  steps.push_back({"model.vs_bench.mpi.fused", "the model against the MPI bench rows", [&r] {
                     return Args{r.laga,         "model",
                                 "--hw",         r.J("hw.here.json"),
                                 "--comm-json",  r.J("bench_comm.mpi.json"),
                                 "--bench-json", r.J("bench.mpi.fused.json"),
                                 "--json",       r.J("model.vs_bench.mpi.fused.json")};
                   }});
  // The paper's configurations (DeepSeek-V3, fused, bf16): P 8 in one node, P 16 over two, T
  // 4K–16K, on the hardware files of docs/hw (each number an assumption with its source).
  for (const char* hw : {"ascend-910b", "h100-class"})
    for (const char* P : {"8", "16"})
      for (const char* T : {"4096", "8192", "16384"})
        steps.push_back(
            {fmt::format("model.paper.{}.p{}.t{}", hw, P, T),
             fmt::format("predicted at the paper's P {} T {} on {}", P, T, hw), [&r, hw, P, T] {
               return Args{r.laga,    "model",
                           "--model", "deepseek-v3",
                           "--seq",   T,
                           "--sp",    P,
                           "--hw",    r.hw(hw),
                           "--json",  r.J(fmt::format("model.paper.{}.p{}.t{}.json", hw, P, T))};
             }});
  // Which form wins where: the model over a grid of models (H 16, 128), T, P (8 .. 64) and link
  // scales, on each hardware file (this machine's calibrated one has one node of 2 ranks: its
  // measured rows are the bench's, beside the grid in the report).
  for (const char* hw : {"ascend-910b", "h100-class"})
    steps.push_back({fmt::format("model.grid.{}", hw),
                     fmt::format("which form wins where, predicted on {}", hw), [&r, hw] {
                       return Args{r.laga,
                                   "model",
                                   "--grid",
                                   "--hw",
                                   r.hw(hw),
                                   "--json",
                                   r.J(fmt::format("model.grid.{}.json", hw))};
                     }});
  // The model beside published GPU and TPU measurements (docs/published.json, docs/model.md §7).
  steps.push_back({"model.published", "the model beside published measurements", [&r] {
                     return Args{r.laga,        "model",
                                 "--published", r.res + "/docs/published.json",
                                 "--json",      r.J("model.published.json")};
                   }});
}

// A byte-level language model (examples/train_lm.py: tiny, 2 layers, T 256, B 4, fp32) trained
// twice from the same weights and data: with laga's attention at P 2, two processes under torchrun
// over gloo, and with the plain PyTorch MLA in one process. Each writes its curves and step times
// to train_lm.<attention>.json. The package is the one beside this binary (python_package_dir);
// without it, or without torch, the step fails saying why.
void train_lm_steps(const Report& r, std::vector<Step>& steps) {
  for (const char* attention : {"laga", "torch"})
    steps.push_back(
        {fmt::format("train_lm.{}", attention),
         fmt::format("a byte-level LM, attention {} ({})", attention,
                     std::string(attention) == "laga" ? "P 2, torchrun" : "one process"),
         [&r, attention] {
           const std::string pkg = python_package_dir();
           if (pkg.empty())
             return Args{"bash", "-c",
                         fmt::format("echo 'laga report: no laga Python package beside {} (in "
                                     "../python or ../lib/python3/dist-packages): build the "
                                     "target laga_python, or install laga'; exit 1",
                                     r.laga)};
           std::string path = pkg;  // ahead of the caller's PYTHONPATH, if any
           if (const char* had = std::getenv("PYTHONPATH"); had && *had)
             path += ":" + std::string(had);
           Args argv = {"env", "PYTHONPATH=" + path, "/usr/bin/python3"};
           // -r 1 -t 1: torchrun's default stream settings do not parse under torch 1.13 with
           // Python 3.11; --standalone: a free port, whatever else runs on this machine; the
           // ranks' own logs in DIR/logs.
           if (std::string(attention) == "laga")
             argv = cat(argv, {"-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                               "2", "-r", "1", "-t", "1", "--log_dir", r.J("logs/train_lm.ranks")});
           const int n = r.quick ? 150 : 300;
           return cat(
               argv, {r.res + "/examples/train_lm.py", "--attention", attention, "--form", "laga",
                      "--steps", std::to_string(n), "--eval-every", std::to_string(n / 6), "--json",
                      r.J(fmt::format("train_lm.{}.json", attention))});
         }});
}

// Every step, in the order it runs.
std::vector<Step> report_steps(const Report& r) {
  std::vector<Step> steps;
  measurement_steps(r, steps);
  link_steps(r, steps);
  model_steps(r, steps);
  steps.push_back({"train", "training curves (tiny, fp32, P 4)", [&r] {
                     return Args{r.laga,    "train",
                                 "--model", "tiny",
                                 "--seq",   "64",
                                 "--sp",    "4",
                                 "--dtype", "fp32",
                                 "--steps", r.quick ? "100" : "200",
                                 "--forms", Report::join(r.train_forms),
                                 "--json",  r.J("train.json")};
                   }});
  train_lm_steps(r, steps);
  steps.push_back(repeat_step(r, "late"));
  return steps;
}

// Runs every step in turn, each recorded in steps.json as it ends; the number that failed.
int run_steps(const Report& r, const std::vector<Step>& steps) {
  fmt::print("laga report: {} steps into {}{}\n", steps.size(), r.out, r.quick ? " (--quick)" : "");
  std::fflush(stdout);
  nlohmann::json record = nlohmann::json::array();
  int failed = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    const Args argv = s.argv();
    const std::string log = r.J("logs/" + s.name + ".log");
    std::filesystem::create_directories(r.out + "/logs");
    fmt::print("  [{}/{}] {}: {} ... ", i + 1, steps.size(), s.name, s.title);
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    const int rc = run_logged(argv, log, r.res);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string status = rc == 0 ? "ok" : "failed", reason;
    if (rc == 77 || (rc == 2 && s.link))
      status = "skipped", reason = last_line(log);
    else if (rc != 0)
      reason = fmt::format("exit {}: {}", rc, last_line(log)), ++failed;
    fmt::print("{} ({:.1f} s){}\n", status, secs, reason.empty() ? "" : " — " + reason);
    std::fflush(stdout);
    std::string command;
    for (const auto& a : argv) command += (command.empty() ? "" : " ") + a;
    record.push_back({{"name", s.name},
                      {"title", s.title},
                      {"command", command},
                      {"status", status},
                      {"exit", rc},
                      {"seconds", secs},
                      {"log", "logs/" + s.name + ".log"},
                      {"reason", reason}});
    std::ofstream(r.J("steps.json"))
        << nlohmann::json{{"quick", r.quick}, {"steps", record}}.dump(2) << "\n";
  }
  return failed;
}

// scripts/report.py: DIR/report.md and its plots from the steps' JSON.
void write_report(const Report& r) {
  fmt::print("  writing {}/report.md ... ", r.out);
  std::fflush(stdout);
  const int rc = run_logged({"/usr/bin/python3", r.res + "/scripts/report.py", r.out},
                            r.J("logs/report.py.log"), r.res);
  LAGA_CHECK(rc == 0, "laga report: scripts/report.py failed (exit {}): {}; see {}", rc,
             last_line(r.J("logs/report.py.log")), r.J("logs/report.py.log"));
}

}  // namespace

int cmd_report(const std::string& out_dir, bool quick) {
  LAGA_CHECK(!out_dir.empty(), "laga report needs --out DIR");
  const Report r = report_of(out_dir, quick);
  write_forms_json(r);
  const int failed = run_steps(r, report_steps(r));
  write_report(r);
  fmt::print("done\nlaga report: {}/report.md{}\n", r.out,
             failed ? fmt::format(" — {} step(s) failed (see steps.json and logs/)", failed) : "");
  return failed ? 1 : 0;
}

}  // namespace laga::cli
