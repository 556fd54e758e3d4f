// The synthetic regression task of train.hpp: teacher forward, student forward + backward, grad
// sync, Adam on fp32 master weights (replicated: every rank applies the same update to the same
// numbers).
#include "laga/driver/train.hpp"

#include <chrono>
#include <cmath>

#include "laga/mla/block.hpp"
#include "laga/driver/run.hpp"
#include "laga/mla/form.hpp"
#include "laga/io/checkpoint.hpp"
#include "laga/mla/weights.hpp"

namespace laga {

uint64_t train_data_seed(uint64_t seed, int64_t step) {
  return seed + 1000003ull * uint64_t(step + 1);
}

nlohmann::json train_identity(const Config& cfg, const TrainOptions& opt) {
  const MlaConfig& c = *cfg;
  // --overlap moves where collectives are waited, not one bit of the results
  // (tests/mla/test_overlap.cpp): a run may resume under either setting, so it is not part of what
  // identifies the run.
  nlohmann::json config = c.to_json();
  config.erase("overlap");
  // Pu once, at the top level, so that a resume with another --ulysses is refused naming both
  // values;
  // --ulysses P (or 0) is the same run as none.
  config.erase("ulysses");
  return {{"task", "teacher-student regression, Adam on fp32 masters (laga train)"},
          {"config", config},
          {"sp", c.sp},
          {"ulysses", c.head_group()},
          {"form", c.form},
          {"dtype", std::string(dtype_name(c.dtype))},
          {"kernel", std::string(kernel_name(c.kernel))},
          {"lr", opt.lr},
          {"beta1", opt.beta1},
          {"beta2", opt.beta2},
          {"eps", opt.eps},
          {"seed", opt.seed}};
}

Config teacher_config(const Config& c) {
  if (form_of(*c).layout(*c) != TokenLayout::contiguous) return c;
  return c.with([](MlaConfig& t) { t = as_form(t, kBaselineForm); });
}

void train_state_shape(const Config& cfg, std::vector<std::string>& names,
                       std::vector<int64_t>& sizes) {
  names.clear(), sizes.clear();
  const auto shapes = layer_weight_shapes(*cfg);
  for (int64_t l = 0; l < cfg->num_layers; ++l)
    for (const auto& [name, shape] : shapes) {
      names.push_back(fmt::format("layers.{}.{}", l, name));
      sizes.push_back(shape_numel(shape));
    }
}

namespace {

// The student's weights set to the masters rounded, exactly as after the update that wrote them.
void load_masters(Weights& student, const std::vector<std::vector<float>>& master,
                  const std::vector<std::string>& names) {
  size_t k = 0;
  student.for_each([&](const std::string&, Tensor& t) {
    LAGA_ASSERT(int64_t(master[k].size()) == t.numel(), "checkpoint tensor {} has the wrong size",
                names[k]);
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, master[k][size_t(i)]);
    ++k;
  });
}

// One Adam step (bias-corrected) of step `step` on the fp32 masters and moments, in for_each order;
// the student's weights become the masters rounded.
void adam_update(Weights& student, Weights& grads, std::vector<std::vector<float>>& master,
                 std::vector<std::vector<float>>& m1, std::vector<std::vector<float>>& m2,
                 const TrainOptions& opt, int64_t step) {
  const double b1t = 1 - std::pow(opt.beta1, double(step + 1)),
               b2t = 1 - std::pow(opt.beta2, double(step + 1));
  size_t k = 0;
  std::vector<Tensor*> params;
  student.for_each([&](const std::string&, Tensor& t) { params.push_back(&t); });
  grads.for_each([&](const std::string&, Tensor& gt) {
    Tensor& p = *params[k];
    auto& w = master[k];
    auto& a = m1[k];
    auto& b = m2[k];
    for (int64_t i = 0; i < gt.numel(); ++i) {
      const double g = gt.get(i);
      a[size_t(i)] = float(opt.beta1 * a[size_t(i)] + (1 - opt.beta1) * g);
      b[size_t(i)] = float(opt.beta2 * b[size_t(i)] + (1 - opt.beta2) * g * g);
      w[size_t(i)] -=
          float(opt.lr * (a[size_t(i)] / b1t) / (std::sqrt(b[size_t(i)] / b2t) + opt.eps));
      p.set(i, w[size_t(i)]);
    }
    ++k;
  });
}

}  // namespace

TrainResult train_rank(const Config& cfg, const TrainOptions& opt, Communicator& comm) {
  const MlaConfig& c = *cfg;
  LAGA_CHECK(opt.steps >= 1, "--steps {} must be at least 1", opt.steps);
  MemoryTracker tracker;
  TrackerScope scope(tracker);
  const Config teacher_cfg = teacher_config(cfg);
  Weights teacher = allocate_weights(c, "teacher");
  init_weights(teacher, c, opt.seed ^ 0x7eac4e7ull);
  Weights student = allocate_weights(c, "weights");
  init_weights(student, c, opt.seed);
  // fp32 master weights and Adam moments, in for_each order.
  std::vector<std::vector<float>> master, m1, m2;
  std::vector<std::string> names;
  student.for_each([&](const std::string& name, const Tensor& t) {
    names.push_back(name);
    master.push_back(t.to_floats());
    m1.emplace_back(size_t(t.numel()), 0.0f);
    m2.emplace_back(size_t(t.numel()), 0.0f);
  });
  TrainResult result;
  int64_t first = 0;
  if (opt.resume) {
    // The checkpoint's masters, moments and history; the student's weights are the masters rounded,
    // exactly as after the update that wrote them.
    const TrainState& r = *opt.resume;
    LAGA_ASSERT(r.names == names, "the checkpoint's weights are not this model's");
    master = r.master, m1 = r.m1, m2 = r.m2;
    load_masters(student, master, names);
    first = r.manifest.step;
    result.losses = r.manifest.losses;
    LAGA_CHECK(first <= opt.steps,
               "--resume: the checkpoint is at step {}, past --steps {}; give --steps {} or more",
               first, opt.steps, first);
    LAGA_ASSERT(r.manifest.next_data_seed == train_data_seed(opt.seed, first),
                "checkpoint data seed");
  }
  result.resumed_from = first;
  const bool writer = !opt.checkpoint_dir.empty() && comm.rank() == 0;
  auto checkpoint = [&](int64_t done) {
    TrainState s;
    s.manifest.step = done, s.manifest.next_step = done;
    s.manifest.next_data_seed = train_data_seed(opt.seed, done);
    s.manifest.losses = result.losses;
    s.manifest.identity = train_identity(cfg, opt);
    s.names = names, s.master = master, s.m1 = m1, s.m2 = m2;
    write_train_checkpoint(opt.checkpoint_dir, std::move(s));
  };
  const double count = double(c.seq_len * c.batch * c.hidden_size);
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = first; step < opt.steps; ++step) {
    const uint64_t data_seed = train_data_seed(opt.seed, step);
    Tensor x = make_input_shard(c, comm.rank(), data_seed, "x", "input.x");
    Tensor target;
    {
      StackSaved discard;
      target = stack_forward(teacher_cfg, teacher, x, discard, comm);
    }
    StackSaved saved;
    Tensor y = stack_forward(cfg, student, x, saved, comm);
    // loss = ½ Σ (y − t)² / count;  dy = (y − t) / count
    Tensor dy = Tensor::empty(y.shape(), y.dtype(), "input.dy");
    double local = 0;
    for (int64_t i = 0; i < y.numel(); ++i) {
      double d = double(y.get(i)) - double(target.get(i));
      local += 0.5 * d * d;
      dy.set(i, float(d / count));
    }
    float loss_parts = float(local);
    comm.all_reduce(&loss_parts, 1, DType::f32, "loss");
    result.losses.push_back(double(loss_parts) / count);
    Weights grads = zero_grads(c, "grads");
    stack_backward(cfg, student, saved, dy, grads, comm);
    grads.for_each([&](const std::string&, Tensor& t) {
      comm.all_reduce(t.raw(), t.numel(), t.dtype(), "grad_sync");
    });
    adam_update(student, grads, master, m1, m2, opt, step);
    if (writer && step + 1 < opt.steps && opt.checkpoint_every > 0 &&
        (step + 1) % opt.checkpoint_every == 0)
      checkpoint(step + 1);
  }
  if (writer) checkpoint(opt.steps);
  if (!opt.dump_weights.empty() && comm.rank() == 0) write_weights(opt.dump_weights, c, student);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return result;
}

TrainResult train_group(const Config& c, const TrainOptions& opt, double timeout_s) {
  TrainResult out;
  run_threads(
      int(c->sp),
      [&](Communicator& comm) {
        TrainResult r = train_rank(c, opt, comm);
        if (comm.rank() == 0) out = std::move(r);
      },
      timeout_s);
  return out;
}

}  // namespace laga
