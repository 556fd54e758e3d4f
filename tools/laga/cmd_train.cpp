// laga train: a few hundred optimizer steps of each form on the synthetic regression task
// (train.hpp), same seed for every form. Checks that every loss is finite and that every form's
// curve agrees with the first form's (explicit's by default; a sparse form's with the first sparse
// form's) to floating-point noise; exit 1 otherwise. How far the loss fell (whether it halved: JSON
// "decreased") is reported, not judged: it depends on the model, the steps and the learning rate,
// not on whether the forms are right.
// --ulysses Pu is laga-ulysses's Pu (head scatter in groups of Pu × a ring over the P/Pu groups;
// laga in --forms with it names laga-ulysses); the other forms run over the whole group (as_form).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/error.hpp"
#include "laga/driver/launch.hpp"
#include "laga/driver/train.hpp"
#include "laga/io/checkpoint.hpp"
#include "laga/io/train_checkpoint.hpp"

namespace laga::cli {

int cmd_train(const CommonFlags& f, const std::vector<std::string>& forms, int64_t steps, double lr,
              const TrainFlags& t) {
  // Each form as as_form gives it: --ulysses is laga-ulysses's (head scatter × ring), the others
  // run over the whole group; a named form that cannot run the configuration is refused
  // (named_form_config).
  const MlaConfig base = build_spec(f);
  auto json_out = is_root_process() ? open_output(f.json_path, "--json") : nullptr;
  if (is_root_process() && !t.dump_weights.empty()) open_output(t.dump_weights, "--dump-weights");
  if (is_root_process() && !t.checkpoint_dir.empty()) check_writable_dir(t.checkpoint_dir);
  TrainOptions opt;
  opt.steps = steps, opt.lr = lr, opt.seed = f.seed;
  opt.checkpoint_every = t.checkpoint_every, opt.dump_weights = t.dump_weights;
  std::vector<Config> configs;
  for (const auto& name : forms)
    configs.push_back(named_form_config(base, form_label(name, f), "--forms"));
  // A --checkpoint directory holding a checkpoint of a form is only continued, never overwritten by
  // another run: it must be the --resume directory.
  if (!t.checkpoint_dir.empty()) {
    std::error_code ec;
    const bool continues =
        !t.resume_dir.empty() && std::filesystem::equivalent(t.checkpoint_dir, t.resume_dir, ec);
    for (const Config& c : configs) {
      const std::string dir = train_checkpoint_dir(t.checkpoint_dir, c->form);
      LAGA_CHECK(continues || !has_train_checkpoint(dir),
                 "--checkpoint {}: {} already holds a checkpoint of another "
                 "run; continue it with --resume {}, or choose an empty directory",
                 t.checkpoint_dir, dir, t.checkpoint_dir);
    }
  }
  // Every process reads (and checks) the checkpoints before any work: the state is replicated.
  std::vector<TrainState> resume(t.resume_dir.empty() ? 0 : configs.size());
  for (size_t i = 0; i < resume.size(); ++i) {
    std::vector<std::string> names;
    std::vector<int64_t> sizes;
    train_state_shape(configs[i], names, sizes);
    resume[i] = read_train_checkpoint(train_checkpoint_dir(t.resume_dir, configs[i]->form),
                                      train_identity(configs[i], opt), names, sizes);
    LAGA_CHECK(resume[i].manifest.step <= steps,
               "--resume {}: the checkpoint of {} is at step {}, past --steps {}; "
               "give --steps {} or more",
               t.resume_dir, configs[i]->form, resume[i].manifest.step, steps,
               resume[i].manifest.step);
  }
  std::vector<TrainResult> results(configs.size());
  std::string backend;
  const bool root = launch(launch_kind(f.comm), [&](Launcher& launcher) {
    backend = launcher.backend();
    for (size_t i = 0; i < configs.size(); ++i)
      launcher.run(
          int(base.sp),
          [&](Communicator& comm) {
            TrainOptions o = opt;
            if (!t.checkpoint_dir.empty())
              o.checkpoint_dir = train_checkpoint_dir(t.checkpoint_dir, configs[i]->form);
            if (!resume.empty()) o.resume = &resume[i];
            TrainResult r = train_rank(configs[i], o, comm);
            if (comm.rank() == 0) results[i] = std::move(r);
          },
          f.timeout_s);
  });
  if (!root) return 0;
  // Agreement between forms: relative difference of each loss from explicit's.
  const double tol = base.dtype == DType::f32 ? 1e-3 : 5e-2;
  nlohmann::json runs = nlohmann::json::array();
  // The first dense form's curve, and the first sparse form's: a sparse form (DeepSeek Sparse
  // Attention) trains another function, and agrees with the other sparse forms.
  std::vector<double> references[2];
  bool pass = true;
  fmt::print(
      "laga train: model {}{} T {} B {} P {}{} ({}) L {} kernel {} dtype {} steps {} lr {:g}\n",
      base.model, attention_only_note(base), base.seq_len, base.batch, base.sp, ulysses_note(base),
      backend, base.num_layers, kernel_name(base.kernel), dtype_name(base.dtype), steps, lr);
  fmt::print("# {:<18} {:>12} {:>12} {:>12} {:>16} {:>9}\n", "form", "loss[0]", "loss[mid]",
             "loss[last]", "max rel vs 1st", "seconds");
  for (size_t i = 0; i < configs.size(); ++i) {
    const Config& c = configs[i];
    const TrainResult& r = results[i];
    double max_rel = 0;
    std::vector<double>& reference = references[form_of(*c).sparse()];
    if (reference.empty()) reference = r.losses;
    for (size_t i = 0; i < r.losses.size(); ++i)
      max_rel = std::max(max_rel, std::abs(r.losses[i] - reference[i]) / std::abs(reference[i]));
    const bool decreased = r.losses.back() < 0.5 * r.losses.front();
    const bool finite =
        std::all_of(r.losses.begin(), r.losses.end(), [](double l) { return std::isfinite(l); });
    const bool agrees = max_rel <= tol;
    pass = pass && finite && agrees;
    const std::string label = displayed_form(*c);
    fmt::print("  {:<18} {:>12.5e} {:>12.5e} {:>12.5e} {:>16.3e} {:>9.2f}{}{}{}\n", label,
               r.losses.front(), r.losses[r.losses.size() / 2], r.losses.back(), max_rel, r.seconds,
               decreased ? "" : "  (loss did not halve)",
               finite ? "" : "  FAIL: a loss is not finite",
               agrees ? "" : "  FAIL: differs from the first form");
    runs.push_back({{"form", find_form(c->form).family()},
                    {"variant", c->form},
                    {"label", label},
                    {"ulysses", form_of(*c).takes_ulysses() ? c->ulysses : 0},
                    {"losses", r.losses},
                    {"seconds", r.seconds},
                    {"max_rel_vs_first", max_rel},
                    {"decreased", decreased},
                    {"resumed_from", r.resumed_from}});
  }
  fmt::print("train: {} (curves agree within {:g} relative; every loss finite)\n",
             pass ? "pass" : "FAIL", tol);
  if (json_out) {
    nlohmann::json j = {{"command", "train"}, {"config", base.to_json()},
                        {"steps", steps},     {"lr", lr},
                        {"runs", runs},       {"pass", pass}};
    *json_out << j.dump(2) << "\n";
  }
  return pass ? 0 : 1;
}

}  // namespace laga::cli
