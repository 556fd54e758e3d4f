// The laga command line: its subcommands and flags (docs/cli.md), parsed and checked (see
// parse.hpp).
#include "parse.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "laga/core/bytes.hpp"
#include "laga/core/error.hpp"
#include "laga/core/fault.hpp"
#include "laga/driver/launch.hpp"
#include "bench_comm.hpp"
#include "verify/forms.hpp"

namespace laga::cli {

namespace {

// bench and train run a --ulysses other than --sp for the forms that take it alone (as_form):
// without one in --forms it would change nothing, so it is refused rather than ignored.
void check_ulysses_named(const CommonFlags& f, const std::vector<std::string>& labels) {
  // none, or Pu = P: every form over the whole group
  if (f.ulysses <= 0 || f.ulysses == f.sp) return;
  std::string spellings;
  for (const Form* t : registered_forms()) {
    if (!t->takes_ulysses()) continue;
    if (std::find(labels.begin(), labels.end(), t->name()) != labels.end()) return;
    spellings +=
        fmt::format("{}{} (or {})", spellings.empty() ? "" : ", ", t->name(), t->ulysses_of());
  }
  LAGA_FAIL_USAGE(
      "--ulysses {} is {}'s (head scatter in groups of {} ranks × a ring over the groups), but "
      "--forms names none of them; add {} to --forms, or drop --ulysses",
      f.ulysses, ulysses_form_names(), f.ulysses, spellings);
}

// The labels --forms names (form_label), each once.
std::vector<std::string> forms_labels(const CommonFlags& f, const std::vector<std::string>& forms) {
  LAGA_CHECK(!forms.empty(), "--forms is empty; valid: {}", form_names());
  std::vector<std::string> labels;
  for (const auto& name : forms) {
    LAGA_CHECK(!name.empty(), "--forms has an empty name; valid: {}", form_names());
    const std::string label = form_label(name, f);
    LAGA_CHECK(std::find(labels.begin(), labels.end(), label) == labels.end(),
               "--forms names {} twice{}; give each form once", label,
               name == label ? "" : fmt::format(" ('{}' names it here)", name));
    labels.push_back(label);
  }
  return labels;
}

// --ulysses's help: the option of laga-ulysses (and of laga, which it then names).
constexpr const char* kUlyssesHelp =
    "laga-ulysses's ranks per head-scatter group Pu, a ring over the P/Pu groups (Pu divides --sp "
    "and the heads; 0: the largest such Pu below --sp); with laga, a Pu other than --sp names "
    "laga-ulysses";

constexpr const char* kDescription =
    "laga: MLA training under sequence parallelism, in the explicit, absorbed and LAGA forms";

// Every subcommand and flag of laga, bound to inv's fields.
// Long on purpose: the whole command line as one list, one declaration per flag in --help's order.
void build_app(CLI::App& app, Invocation& inv) {
  app.require_subcommand(1);
  CommonFlags& flags = inv.flags;

  auto* run =
      app.add_subcommand("run", "one forward + backward of the block stack on P ranks, measured");
  add_common(run, flags, true);
  run->add_option("--sp", flags.sp, "ranks in the sequence-parallel group P")
      ->capture_default_str();
  run->add_option("--ulysses", flags.ulysses, kUlyssesHelp)->capture_default_str();
  run->add_option("--form", flags.form,
                  "a registered form (" + form_names() + "), or absorbed with --absorbed-kv")
      ->capture_default_str();
  run->add_option("--dump", inv.dump_dir,
                  "write config.json and tensors.safetensors (whole tensors, gathered to rank 0)");
  run->add_option("--weights", inv.weights,
                  "load weights from a laga dump or a Hugging Face DeepSeek shard (.safetensors)");
  run->add_option("--inject-fault", inv.fault,
                  "testing: RANK:PLACE; PLACE forward or backward (that rank fails there), stall "
                  "(10 s), slow (50 ms per layer), kill, nan-x, nan-dy, inf-wkv_b");
  run->add_option("--stand-in", inv.stand_in,
                  "run only rank R of the --sp group, the other ranks' traffic stood in for "
                  "(memory and traffic "
                  "measurements at scale; numbers are not meaningful)");
  run->add_option("--mem-limit", inv.mem_limit,
                  "refuse a run whose planned per-rank peak exceeds this (e.g. 16GiB; default: "
                  "available memory / ranks)");

  auto* plan = app.add_subcommand(
      "plan", "per-rank memory and communication of every form, from the configuration");
  add_common(plan, flags, false);
  plan->get_option("--seq")->required(false);
  plan->add_option("--sp", flags.sp, "ranks in the sequence-parallel group P")
      ->capture_default_str();
  plan->add_option("--ulysses", flags.ulysses, kUlyssesHelp)->capture_default_str();
  plan->add_flag("--sweep", inv.sweep,
                 "tables over T × P × kernel and H, with linear fits of absorbed's excess");
  plan->add_option("--mem-limit", inv.mem_limit,
                   "fail (exit 2) if the planned per-rank peak exceeds this, e.g. 80GB");

  auto* verify =
      app.add_subcommand("verify", "the forms against each other and the fp64 reference");
  add_common(verify, flags, true);
  verify->add_option("--sp", inv.sps, "rank counts to check, e.g. 1,2,4,8")
      ->delimiter(',')
      ->capture_default_str();
  verify
      ->add_option("--ulysses", flags.ulysses,
                   "laga-ulysses's ranks per head-scatter group Pu at every --sp (not run where Pu "
                   "does not divide it and the heads; 0: the largest such Pu below each --sp)")
      ->capture_default_str();
  verify->add_option("--mem-limit", inv.mem_limit,
                     "refuse a sweep whose estimated peak in this process exceeds this (e.g. "
                     "16GiB; default: available "
                     "memory, divided among the local ranks under mpirun)");

  auto* bench = app.add_subcommand(
      "bench",
      "the forms timed side by side, every row validated first: medians, spread and ratios");
  add_common(bench, flags, true);
  bench->remove_option(bench->get_option("--seq"));
  bench->add_option("--seq", inv.seqs, "sequence lengths, e.g. 1024,2048")
      ->delimiter(',')
      ->required();
  bench->add_option("--sp", flags.sp, "ranks in the sequence-parallel group P")
      ->capture_default_str();
  bench->add_option("--forms", inv.forms, "forms to time, e.g. explicit,laga")
      ->delimiter(',')
      ->capture_default_str();
  bench
      ->add_option("--ulysses", flags.ulysses,
                   std::string(kUlyssesHelp) + "; the other forms run over the whole group")
      ->capture_default_str();
  bench->add_option("--iters", inv.iters, "timed iterations per form and T (after --warmup)")
      ->capture_default_str();
  bench
      ->add_option("--warmup", inv.warmup,
                   "untimed iterations per form and T before the timed ones")
      ->capture_default_str();
  bench->add_flag("--no-validate", inv.no_validate,
                  "skip the validation (reduced-T rule, full-size finiteness and agreement with "
                  "explicit); rows "
                  "then say 'not validated'");
  bench->add_flag("--profile", inv.profile,
                  "also print each row's time by op class (matmul, attention forward and backward, "
                  "other) with the "
                  "rates achieved in the block; the JSON has it always, with the matmul shapes");
  bench->add_option("--mem-limit", inv.mem_limit,
                    "refuse a bench whose estimated peak in this process exceeds this (e.g. 16GiB; "
                    "default: available "
                    "memory, divided among the local ranks under mpirun)");
  bench->add_option("--inject-fault", inv.fault,
                    "testing: RANK:PLACE as for run (e.g. 1:nan-x), in every run");
  bench->add_option(
      "--inject-wrong", inv.inject_wrong,
      "testing: FORM:ULPS shifts one element of FORM's full-size y by ULPS ulps of max|y| before "
      "validation sees it");

  auto* comm = app.add_subcommand(
      "bench-comm", "laga's collectives timed as nccl-tests does: time, algbw, busbw, #wrong");
  BenchCommFlags& bc = inv.bench_comm;
  comm->add_option("-b,--minbytes", bc.min_bytes, "smallest size (whole buffer), e.g. 8, 64K, 4M")
      ->capture_default_str();
  comm->add_option("-e,--maxbytes", bc.max_bytes, "largest size")->capture_default_str();
  comm->add_option("-f,--stepfactor", bc.factor, "each size is the previous one times this (≥ 2)")
      ->capture_default_str();
  comm->add_option("--ops", bc.ops, "collectives, e.g. all_gather,all_to_all")
      ->delimiter(',')
      ->capture_default_str();
  comm->add_option("--dtype", bc.dtypes, "element types, e.g. bf16,fp32")
      ->delimiter(',')
      ->capture_default_str();
  comm->add_option("--sp", bc.sp, "ranks P (default: the mpirun job's size, or 2 under threads)");
  comm->add_option("-n,--iters", bc.iters, "timed iterations per row")->capture_default_str();
  comm->add_option("-w,--warmup", bc.warmup, "untimed iterations before them")
      ->capture_default_str();
  comm->add_flag(
      "--host-cost", bc.host_cost,
      "also time fixed compute alone and beside each op at the largest size (the first dtype): the "
      "compute its bytes take, ns per byte sent (the model's host_ns_per_byte)");
  comm->add_option("--comm", flags.comm, "auto|threads|mpi (auto: mpi under mpirun)")
      ->capture_default_str();
  comm->add_option("--timeout", flags.timeout_s,
                   "seconds a collective may wait before it fails (0: forever)");
  comm->add_option("--mpi-progress", flags.mpi_progress_us, kMpiProgressHelp)
      ->capture_default_str();
  comm->add_option("--json", flags.json_path, "write the rows as JSON to this file");

  auto* train =
      app.add_subcommand("train", "optimizer steps of each form on a synthetic regression task");
  add_common(train, flags, true);
  train->add_option("--sp", flags.sp, "ranks in the sequence-parallel group P")
      ->capture_default_str();
  train->add_option("--forms", inv.forms, "forms to train, e.g. explicit,absorbed,laga")
      ->delimiter(',')
      ->capture_default_str();
  train
      ->add_option("--ulysses", flags.ulysses,
                   std::string(kUlyssesHelp) + "; the other forms run over the whole group")
      ->capture_default_str();
  train->add_option("--steps", inv.steps, "optimizer steps")->capture_default_str();
  train->add_option("--lr", inv.lr, "Adam learning rate")->capture_default_str();
  train->add_option(
      "--checkpoint", inv.checkpoint_dir,
      "write lossless checkpoints to DIR/<form>/ (atomically; the newest two are kept)");
  train
      ->add_option("--checkpoint-every", inv.checkpoint_every,
                   "steps between checkpoints (0: only after the last step)")
      ->capture_default_str();
  train->add_option("--resume", inv.resume_dir,
                    "continue from the newest checkpoint in DIR/<form>/ (exit 2 if none)");
  train->add_option("--dump-weights", inv.dump_weights,
                    "write the final weights (.safetensors, laga names); one form only");

  auto* report = app.add_subcommand(
      "report", "every measurement in one run: DIR/report.md with tables and plots");
  report->add_option("--out", inv.out_dir, "the directory for report.md, its plots, JSON and logs")
      ->required();
  report->add_flag("--quick", inv.quick,
                   "fewer and shorter measurements (about 8 minutes on two quiet cores)");
  auto* model =
      app.add_subcommand("model",
                         "predicted step time of every form on a hardware file; --calibrate writes "
                         "one for this machine (docs/model.md)");
  add_common(model, flags, false);
  model->get_option("--seq")->required(false);
  model->add_option("--sp", flags.sp, "ranks in the sequence-parallel group P")
      ->capture_default_str();
  model->add_option("--ulysses", flags.ulysses, kUlyssesHelp)->capture_default_str();
  model->add_option("--forms", inv.model.forms, "forms to predict (default: every registered form)")
      ->delimiter(',');
  model->add_option("--hw", inv.model.hw,
                    "hardware file (JSON: compute rates, links, ranks per node; docs/model.md)");
  model->add_option("--bench-json", inv.model.bench_json,
                    "a laga bench --json file: predicted against measured, per row");
  model->add_option("--calibrate", inv.model.calibrate_out,
                    "measure this machine and write a hardware file here");
  model
      ->add_option("--link-scale", inv.model.link_scale,
                   "multiply every link bandwidth of --hw by F (a list with "
                   "--grid; default 1, or 0.25,1,4 with --grid)")
      ->delimiter(',');
  model->add_flag("--grid", inv.model.grid,
                  "the winner of every cell of a grid: deepseek-v2-lite and -v3, T 4K-64K, P 8-64, "
                  "the link scales");
  model->add_option("--published", inv.model.published,
                    "the model beside published measurements: each row of FILE "
                    "(docs/published.json) predicted and compared");
  model->add_option("--comm-json", inv.model.comm_json,
                    "the link from a laga bench-comm --json file: with --calibrate, the file's "
                    "link; with --hw, replacing its intra-node link");
  model
      ->add_option("--calibrate-seq", inv.model.calibrate_seqs,
                   "with --calibrate: measure every rate at these T "
                   "(default 2048; the model reads between them in log T)")
      ->delimiter(',');
  model->add_option(
      "--calibrate-reps", inv.model.calibrate_reps,
      "with --calibrate: timed repeats per measurement after "
      "one warm-up, their median kept (0 or left out: 3; more on a shared, noisy machine)");
}

// Parses into the fields app is bound to; the status to end with now, or nullopt.
std::optional<int> parse_with(CLI::App& app, int argc, const char* const* argv, std::ostream& out,
                              std::ostream& err) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e, out, err);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e, out, err);
  } catch (const CLI::ConversionError& e) {
    // CLI11 says "Could not convert: --seq = 64.5". --lr, --timeout and --mpi-progress take a
    // decimal number, every other numeric option a whole number or a comma-separated list of them
    // (--sp 1,2,4).
    std::string what = e.what();
    const std::string prefix = "Could not convert: ";
    if (what.rfind(prefix, 0) == 0) what = what.substr(prefix.size());
    const std::string name = what.substr(0, what.find(' '));
    std::string hint;
    if (name == "--lr" || name == "--timeout" || name == "--mpi-progress")
      hint = ": not a number; give one, e.g. " + name +
             (name == "--lr"        ? " 1e-3"
              : name == "--timeout" ? " 60"
                                    : " 500");
    else if (what.find(',') != std::string::npos)
      hint = ": not a list of whole numbers; give e.g. " + name + " 1,2,4";
    else
      hint = ": not a whole number; give one, e.g. " + name + (name == "--seq" ? " 1024" : " 2");
    err << "laga: " << what << hint << "\n";
    return 2;
  } catch (const CLI::ParseError& e) {
    err << "laga: " << e.what() << "\n";
    return 2;
  }
  return std::nullopt;
}

// The App, built once per thread (building it costs far more than a parse) and bound to `bound`,
// which is reset to a default Invocation before each parse: CLI11 writes only the flags given, so
// every other field keeps its default, as with a freshly built App.
struct CachedParser {
  Invocation bound;
  CLI::App app{kDescription};
  CachedParser() { build_app(app, bound); }
};

}  // namespace

std::optional<int> parse_args(int argc, const char* const* argv, Invocation& inv, std::ostream& out,
                              std::ostream& err) {
  thread_local CachedParser parser;
  parser.bound = Invocation{};
  parser.app.clear();
  if (auto status = parse_with(parser.app, argc, argv, out, err)) return status;
  inv = parser.bound;
  inv.command = parser.app.get_subcommands().at(0)->get_name();
  return std::nullopt;
}

std::optional<int> parse_args_fresh(int argc, const char* const* argv, Invocation& inv,
                                    std::ostream& out, std::ostream& err) {
  CLI::App app{kDescription};
  build_app(app, inv);
  if (auto status = parse_with(app, argc, argv, out, err)) return status;
  inv.command = app.get_subcommands().at(0)->get_name();
  return std::nullopt;
}

// Long on purpose: every command's checks in one flat list, one rule per check, in the commands'
// order.
void check_invocation(const Invocation& inv) {
  const CommonFlags& f = inv.flags;
  if (!inv.mem_limit.empty()) parse_bytes(inv.mem_limit);
  LAGA_CHECK(f.mpi_progress_us >= 0 && std::isfinite(f.mpi_progress_us),
             "--mpi-progress {} must be a number of microseconds ≥ 0, e.g. 500 (0: progress only "
             "inside MPI calls)",
             f.mpi_progress_us);
  if (inv.command == "run") {
    if (!inv.fault.empty()) set_injected_fault(inv.fault);
    const Config c = build_config(f);
    if (inv.stand_in >= 0) {
      LAGA_CHECK(inv.stand_in < c->sp, "--stand-in {} is not a rank of --sp {}; try 0 .. {}",
                 inv.stand_in, c->sp, c->sp - 1);
      LAGA_CHECK(
          inv.dump_dir.empty(),
          "--stand-in makes up the other ranks' data, so it cannot --dump; drop one of them");
      LAGA_CHECK(launch_kind(f.comm) != LaunchKind::mpi,
                 "--stand-in runs one rank in this process; run it without "
                 "mpirun");
    }
  } else if (inv.command == "plan") {
    LAGA_CHECK(inv.sweep || f.seq > 0, "laga plan needs --seq T (or --sweep)");
    CommonFlags g = f;
    if (inv.sweep && g.seq == 0) g.seq = 4096;
    LAGA_CHECK(!inv.sweep || g.ulysses == 0,
               "laga plan --sweep sweeps P itself and takes no --ulysses; drop one");
    FormsAt at;
    if (inv.sweep)
      (void)build_config(g);
    else
      check_ulysses_runs({spec_for_all_forms(g, at)});
  } else if (inv.command == "verify") {
    CommonFlags g = f;
    g.ulysses = 0;
    const Config base = build_config(g);
    LAGA_CHECK(f.ulysses >= 0, "--ulysses {} must be positive (or 0: none)", f.ulysses);
    // Each P must suit some form, laga-ulysses with --ulysses (as_form) included; a form that
    // refuses it is reported as not run. A --ulysses must run at one P at least.
    std::vector<MlaConfig> specs;
    for (int64_t P : inv.sps) {
      MlaConfig m = *base;
      m.sp = P, m.ulysses = f.ulysses;
      forms_at(m);
      specs.push_back(m);
    }
    check_ulysses_runs(specs);
  } else if (inv.command == "bench") {
    LAGA_CHECK(inv.iters >= 1, "--iters {} must be at least 1", inv.iters);
    LAGA_CHECK(inv.warmup >= 0, "--warmup {} must be a number of iterations ≥ 0", inv.warmup);
    const std::vector<std::string> labels = forms_labels(f, inv.forms);
    check_ulysses_named(f, labels);
    // Each form as as_form gives it (--ulysses is laga-ulysses's): one that cannot run a T is
    // refused, naming why.
    for (int64_t T : inv.seqs) {
      CommonFlags g = f;
      g.seq = T;
      const MlaConfig spec = build_spec(g);
      for (const auto& label : labels) named_form_config(spec, label, "--forms");
    }
    if (!inv.fault.empty()) set_injected_fault(inv.fault);
    if (!inv.inject_wrong.empty()) parse_inject_wrong(inv.inject_wrong, labels, f);
  } else if (inv.command == "bench-comm") {
    const BenchCommFlags& b = inv.bench_comm;
    bench_comm::size_sweep(bench_comm::parse_size(b.min_bytes, "-b"),
                           bench_comm::parse_size(b.max_bytes, "-e"), b.factor);
    LAGA_CHECK(
        !b.ops.empty(),
        "--ops is empty; valid: all_gather, reduce_scatter, all_to_all, all_reduce, send_recv");
    for (const auto& name : b.ops) bench_comm::parse_op(name);
    LAGA_CHECK(!b.dtypes.empty(), "--dtype is empty; valid: bf16, fp32");
    for (const auto& name : b.dtypes) parse_dtype(name);
    LAGA_CHECK(b.sp >= 0, "--sp {} must be a number of ranks ≥ 1 (or left out: the job's size)",
               b.sp);
    LAGA_CHECK(b.iters >= 1, "--iters {} must be at least 1, e.g. --iters 20", b.iters);
    LAGA_CHECK(b.warmup >= 0, "--warmup {} must be ≥ 0, e.g. --warmup 2", b.warmup);
    LAGA_CHECK(f.timeout_s >= 0 && std::isfinite(f.timeout_s),
               "--timeout {} must be a number of seconds ≥ 0", f.timeout_s);
  } else if (inv.command == "train") {
    const MlaConfig spec = build_spec(f);
    const std::vector<std::string> labels = forms_labels(f, inv.forms);
    check_ulysses_named(f, labels);
    for (const auto& label : labels) named_form_config(spec, label, "--forms");
    LAGA_CHECK(inv.steps >= 2, "--steps {} must be at least 2 (a decrease needs two losses)",
               inv.steps);
    LAGA_CHECK(inv.lr > 0 && std::isfinite(inv.lr), "--lr {} must be a positive number, e.g. 1e-3",
               inv.lr);
    LAGA_CHECK(inv.checkpoint_every >= 0, "--checkpoint-every {} must be a number of steps ≥ 0",
               inv.checkpoint_every);
    LAGA_CHECK(inv.checkpoint_every == 0 || !inv.checkpoint_dir.empty(),
               "--checkpoint-every {} needs --checkpoint DIR to write to", inv.checkpoint_every);
    LAGA_CHECK(inv.dump_weights.empty() || inv.forms.size() == 1,
               "--dump-weights writes one form's weights, but --forms names {}; give one form",
               inv.forms.size());
  } else if (inv.command == "report") {
    LAGA_CHECK(!inv.out_dir.empty(), "laga report needs --out DIR, e.g. --out report");
  } else if (inv.command == "model") {
    const ModelFlags& m = inv.model;
    if (!m.published.empty()) {
      LAGA_CHECK(m.hw.empty() && m.calibrate_out.empty() && m.bench_json.empty() && !m.grid &&
                     f.seq == 0 && m.forms.empty() && m.link_scale.empty() && m.comm_json.empty(),
                 "--published FILE takes every row's configuration and hardware file from FILE; "
                 "give only --json besides it");
    } else if (!m.calibrate_out.empty()) {
      LAGA_CHECK(m.hw.empty() && m.bench_json.empty() && f.seq == 0,
                 "--calibrate measures this machine and writes a hardware file; it takes no --hw, "
                 "--bench-json or --seq");
      LAGA_CHECK(f.sp >= 1 && f.sp <= 64, "--sp {} must be 1 .. 64", f.sp);
      for (int64_t T : m.calibrate_seqs)
        LAGA_CHECK(T >= 2 * f.sp && T % f.sp == 0 && T <= (int64_t(1) << 17),
                   "--calibrate-seq {}: each T must be a multiple of --sp {} between {} and "
                   "131072, e.g. 2048",
                   T, f.sp, 2 * f.sp);
      LAGA_CHECK(m.calibrate_reps >= 0 && m.calibrate_reps <= 100,
                 "--calibrate-reps {} must be 1 .. 100, e.g. 5 (0 or left out: 3)",
                 m.calibrate_reps);
    } else {
      LAGA_CHECK(m.calibrate_seqs.empty(), "--calibrate-seq goes with --calibrate OUT.json");
      LAGA_CHECK(m.calibrate_reps == 0, "--calibrate-reps goes with --calibrate OUT.json");
      for (double s : m.link_scale)
        LAGA_CHECK(s > 0 && std::isfinite(s),
                   "--link-scale {} must be a positive factor, e.g. 0.25 or 4", s);
      LAGA_CHECK(m.grid || m.link_scale.size() <= 1,
                 "--link-scale takes one factor without --grid; give one, e.g. 4");
      LAGA_CHECK(
          !m.grid || (f.seq == 0 && m.bench_json.empty() && m.forms.empty() && f.ulysses == 0),
          "--grid chooses its own models, T, P and --ulysses over every form; it takes no --seq, "
          "--bench-json, "
          "--forms or --ulysses");
      LAGA_CHECK(f.ulysses >= 0, "--ulysses {} must be positive (or 0: none)", f.ulysses);
      LAGA_CHECK(
          !m.hw.empty(),
          "laga model needs --hw FILE (a hardware file, docs/model.md), or --calibrate OUT.json");
      LAGA_CHECK(m.grid || f.seq > 0 || !m.bench_json.empty(),
                 "laga model needs --seq T (or --bench-json FILE, or --grid)");
      if (f.seq > 0) {
        FormsAt at;
        const MlaConfig spec = spec_for_all_forms(f, at);
        if (m.forms.empty()) check_ulysses_runs({spec});
        for (const auto& name : m.forms)
          build_config([&] {
            CommonFlags g = f;
            g.form = name;
            return g;
          }());
      }
    }
  } else {
    LAGA_ASSERT(false, "laga {} parsed but has no checks", inv.command);
  }
  launch_kind(f.comm);  // an unknown --comm, or --comm mpi without mpirun
}

int parse_only(int argc, const char* const* argv, std::ostream* err, bool fresh_app) {
  std::ostringstream discard;
  std::ostream& messages = err ? *err : discard;
  Invocation inv;
  if (auto status = (fresh_app ? parse_args_fresh : parse_args)(argc, argv, inv, discard, messages))
    return *status;
  try {
    check_invocation(inv);
  } catch (const Error& e) {
    messages << "laga: " << e.what() << "\n";
    return e.exit_status();
  }
  return 0;
}

}  // namespace laga::cli
