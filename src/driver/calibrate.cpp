// Calibration of the performance model on this machine (driver/calibrate.hpp, docs/model.md §3).
#include "laga/driver/calibrate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>

#include "laga/core/error.hpp"
#include "laga/core/machine.hpp"
#include "laga/core/random.hpp"
#include "laga/mla/config.hpp"
#include "laga/ops/attention.hpp"
#include "laga/ops/elementwise.hpp"
#include "laga/ops/indexer.hpp"
#include "laga/ops/latent_attention.hpp"
#include "laga/ops/sparse_attention.hpp"
#include "laga/ops/linear.hpp"
#include "laga/ops/rmsnorm.hpp"
#include "laga/ops/rope.hpp"

namespace laga {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Tensor random(const Shape& s, DType dt, uint64_t seed, const char* name) {
  Tensor t = Tensor::empty(s, dt, name);
  fill_normal(t, seed, name, 1.0);
  return t;
}

// On P ranks at once (threads, bench's threads per rank), each rank makes its own buffers and work
// (make), then runs the work reps + 1 times after a barrier each; the slowest rank's time of each
// repeat, and the median of those after the warm-up.
double timed_on_ranks(int64_t P, int reps, const std::function<std::function<void()>()>& make) {
  std::vector<double> worst(size_t(reps + 1), 0);
  std::mutex mu;
  run_threads(int(P), [&](Communicator& comm) {
    const std::function<void()> fn = make();
    for (int i = 0; i <= reps; ++i) {
      comm.barrier();
      const auto t0 = Clock::now();
      fn();
      const double s = seconds_since(t0);
      std::lock_guard<std::mutex> lock(mu);
      worst[size_t(i)] = std::max(worst[size_t(i)], s);
    }
  });
  return median_after_warmup(std::move(worst));
}

struct AttentionCase {
  const char* key;  // the hardware file's name without "_{fwd,bwd}_tflops"
  Kernel kernel;
  int64_t Hkv, Dqk, Dv;  // executed widths; flops counted with Dv_counted
  int64_t Dv_counted;
};

// The `small` preset (DeepSeek's head dims, D 1024, H 16) on P ranks: each rate is measured at its
// shapes, at E = T/P local rows.
struct CalShape {
  MlaConfig small = MlaConfig::preset("small");
  int64_t P, D, H, Lq, Lkv, Dr, Dqk, Dv, Dl;
  int64_t Hr;  // 2 heads (1 where H/P is 1): the rate per head is what counts
  explicit CalShape(int64_t P_)
      : P(P_),
        D(small.hidden_size),
        H(small.num_attention_heads),
        Lq(small.q_lora_rank),
        Lkv(small.kv_lora_rank),
        Dr(small.qk_rope_head_dim),
        Dqk(small.qk_head_dim()),
        Dv(small.v_head_dim),
        Dl(small.latent_dim()),
        Hr(std::max<int64_t>(1, std::min<int64_t>(2, H / P_))) {}
};

// Every reading is a Measurement: its time (seconds, the median of opt.reps repeats on all ranks
// at once), its work (FLOPs or bytes) and where its rate goes. All are read in two rounds, the
// second after the whole first, so a slow spell of the shared machine (seconds to minutes) hits one
// reading of an entry, not both; an entry whose two readings differ by more than opt.agree is read
// a third time. Each entry keeps the median of its readings (two agreeing: their mean).
enum class Unit { tflops, GBps };  // the file's rates: TFLOP/s (FLOPs), GB/s (bytes)
struct Measurement {
  std::string what;  // "bf16 T 2048 matmul", for the progress line and the notes
  double work;       // FLOPs, or bytes for elementwise
  std::function<double()> seconds;
  std::function<void(double)> store;  // the rate (work / seconds, in unit)
  Unit unit;
  std::vector<double> readings;  // seconds, one per round
};

// What the measurements of one dtype at one T are added with: the shapes, where the rates go (cs,
// in hw), and the progress-line prefix.
struct At {
  const CalShape& s;
  const CalibrationOptions& opt;
  DType dt;
  const char* dn;  // "bf16" | "fp32"
  int64_t T, E;
  ComputeSpec& cs;
};

nlohmann::json calibration_notes(const CalibrationOptions& opt, const CalShape& s) {
  std::string seq_list;
  for (int64_t T : opt.seqs) seq_list += (seq_list.empty() ? "" : ", ") + std::to_string(T);
  return {
      {"kind", "achieved rates (laga's own kernels on this machine), not peaks"},
      {"ranks", s.P},
      {"threads_per_rank", "max(1, cores / P), as laga bench"},
      {"seq", fmt::format("each rate measured at T {} (read between them in log T, held beyond)",
                          seq_list)},
      {"matmul",
       "linear forward + backward of small's projections at T/P rows (and the up-projection at T "
       "rows): "
       "total FLOPs / total time"},
      {"attention",
       fmt::format("T, B 1, {} query heads, causal; dense 192/128, latent 576/512 per head (fused: "
                   "V padded to "
                   "576, counted as 512), mqa 576/512 with one KV head; FlashAttention-3 FLOP "
                   "counting; laga_fused: the latent kernel "
                   "of laga-fused, its FLOPs the attention's plus the up-projection it executes; "
                   "sparse and indexer: the sparse forms' kernels over a block of min(T/P, 512) "
                   "query rows at the sequence's end with small's {} heads, top-k {} and indexer "
                   "{}×{} (forward the attention over the selection and the indexer's top-k; "
                   "backward the attention's and the indexer's loss)",
                   s.Hr, s.H, s.small.index_topk, s.small.index_n_heads, s.small.index_head_dim)},
      {"elementwise",
       fmt::format("rmsnorm forward/backward and rope over [T/P, {}]: bytes read + written / time",
                   s.D)},
      {"accumulate",
       fmt::format(
           "fp32 streams of the ring forms over [T/P, {} heads, {}]: a zeroed accumulator, an add "
           "into it, a log-sum-exp merge of [T/P, {}, {}], a rounding to bf16: bytes read + "
           "written / time; the same in both dtypes' sections",
           s.H, s.Dqk, s.H, s.Dv)}};
}

// matmul: the projections' linear forward + backward ([rows, in] · [out, in]ᵀ)
void add_matmul(const At& a, std::vector<Measurement>& ms) {
  const CalShape& s = a.s;
  const int64_t E = a.E, T = a.T, P = s.P;
  const DType dt = a.dt;
  struct Lin {
    int64_t rows, in, out;
  };
  const std::vector<Lin> lins = {{E, s.D, s.Lq},
                                 {E, s.Lq, s.H * s.Dqk},
                                 {E, s.D, s.Lkv + s.Dr},
                                 {T, s.Lkv, s.Hr * (s.Dqk - s.Dr + s.Dv)},
                                 {E, s.H * s.Dv, s.D}};
  double flops = 0;
  for (const Lin& l : lins) flops += 6.0 * double(l.rows) * double(l.in) * double(l.out);
  ms.push_back({fmt::format("{} T {} matmul", a.dn, T),
                flops,
                [=, &opt = a.opt] {
                  double secs = 0;
                  for (const Lin& l : lins)
                    secs += timed_on_ranks(P, opt.reps, [&]() -> std::function<void()> {
                      Tensor x = random({l.rows, l.in}, dt, 1, "cal.x"),
                             w = random({l.out, l.in}, dt, 2, "cal.w");
                      Tensor dy = random({l.rows, l.out}, dt, 3, "cal.dy"),
                             dx = Tensor::empty({l.rows, l.in}, dt, "cal.dx");
                      Tensor dw = Tensor::zeros({l.out, l.in}, DType::f32, "cal.dw");
                      return [x, w, dy, dx, dw]() mutable {
                        Tensor y = linear_forward(x, w, "cal.y");
                        linear_backward(x, w, dy, &dx, false, dw);
                      };
                    });
                  return secs;
                },
                [&cs = a.cs, T](double r) { cs.matmul_tflops.by_seq[T] = r; },
                Unit::tflops,
                {}});
}

// An attention kernel's rates at T under `key`: forward and backward, each its own measurement on
// fresh buffers from make(backward), their FLOPs as the work ledger records them (core/work.hpp).
using Maker = std::function<std::function<std::function<void()>()>(bool)>;
void add_attention_rates(const At& a, const std::string& key, double fwd_flops, double bwd_flops,
                         const Maker& make, std::vector<Measurement>& ms) {
  for (bool backward : {false, true}) {
    const std::string name = key + (backward ? "_bwd_tflops" : "_fwd_tflops");
    ms.push_back(
        {fmt::format("{} T {} {} {}", a.dn, a.T, key, backward ? "backward" : "forward"),
         backward ? bwd_flops : fwd_flops,
         [P = a.s.P, reps = a.opt.reps, work = make(backward)] {
           return timed_on_ranks(P, reps, work);
         },
         [&cs = a.cs, name, T = a.T](double r) { cs.attention_tflops[name].by_seq[T] = r; },
         Unit::tflops,
         {}});
  }
}

// attention, per kernel and shape
void add_attention(const At& at, std::vector<Measurement>& ms) {
  const CalShape& s = at.s;
  const int64_t T = at.T, Hr = s.Hr;
  const DType dt = at.dt;
  const AttentionCase cases[] = {{"attention", Kernel::fused, Hr, s.Dqk, s.Dv, s.Dv},
                                 {"eager_attention", Kernel::eager, Hr, s.Dqk, s.Dv, s.Dv},
                                 {"latent_attention", Kernel::fused, Hr, s.Dl, s.Dl, s.Lkv},
                                 {"eager_latent_attention", Kernel::eager, Hr, s.Dl, s.Lkv, s.Lkv},
                                 {"mqa_attention", Kernel::fused, 1, s.Dl, s.Lkv, s.Lkv},
                                 {"eager_mqa_attention", Kernel::eager, 1, s.Dl, s.Lkv, s.Lkv}};
  for (const AttentionCase& a : cases) {
    // Each rank its own tensors; a backward needs a forward's saved state, so it is timed after
    // one.
    auto make = [=, scale = float(s.small.softmax_scale())](bool backward) {
      return [=]() -> std::function<void()> {
        auto t = std::make_shared<std::vector<Tensor>>();
        Tensor q = random({T, 1, Hr, a.Dqk}, dt, 4, "cal.q"),
               k = random({T, 1, a.Hkv, a.Dqk}, dt, 5, "cal.k");
        Tensor v = random({T, 1, a.Hkv, a.Dv}, dt, 6, "cal.v"),
               o = Tensor::empty({T, 1, Hr, a.Dv}, dt, "cal.o");
        Tensor dout = random({T, 1, Hr, a.Dv}, dt, 7, "cal.do");
        Tensor dq = Tensor::empty(q.shape(), dt, "cal.dq"),
               dk = Tensor::empty(k.shape(), dt, "cal.dk");
        Tensor dv = Tensor::empty(v.shape(), dt, "cal.dv");
        *t = {q, k, v, o, dout, dq, dk, dv};
        AttentionFwdParams p;
        p.B = 1, p.T = T, p.Hq = Hr, p.Hkv = a.Hkv, p.Dqk = a.Dqk, p.Dv = a.Dv, p.dtype = dt;
        p.scale = scale, p.causal = true;
        p.q = q.raw(), p.q_stride = dense_strides(1, Hr, a.Dqk), p.k = k.raw(),
        p.k_stride = dense_strides(1, a.Hkv, a.Dqk);
        p.v = v.raw(), p.v_stride = dense_strides(1, a.Hkv, a.Dv), p.o = o.raw(),
        p.o_stride = dense_strides(1, Hr, a.Dv);
        AttentionBwdParams b;
        static_cast<AttentionFwdParams&>(b) = p;
        b.dout = dout.raw(), b.dout_stride = p.o_stride, b.dq = dq.raw(), b.dq_stride = p.q_stride;
        b.dk = dk.raw(), b.dk_stride = p.k_stride, b.dv = dv.raw(), b.dv_stride = p.v_stride;
        const Kernel kernel = a.kernel;
        if (!backward) return [t, p, kernel] { AttentionSaved s = attention_forward(kernel, p); };
        auto saved = std::make_shared<AttentionSaved>(attention_forward(kernel, p));
        return [t, b, kernel, saved] { attention_backward(kernel, b, *saved); };
      };
    };
    const double fl = attention_forward_flops(1, Hr, T, a.Dqk, a.Dv_counted, true);
    add_attention_rates(at, a.key, fl, 2.5 * fl, make, ms);
  }
}

// laga-fused's latent kernel: the attention and the up-projection it runs inside, together
void add_laga_fused(const At& at, std::vector<Measurement>& ms) {
  const CalShape& s = at.s;
  const int64_t T = at.T, Hr = s.Hr, Dl = s.Dl, Lkv = s.Lkv, Dqk = s.Dqk, Dv = s.Dv;
  const DType dt = at.dt;
  LatentAttentionParams dims;  // the shapes; make adds each rank's buffers
  dims.B = 1, dims.T = T, dims.H = Hr, dims.Lkv = Lkv, dims.Dr = s.Dr, dims.Dn = Dqk - s.Dr,
  dims.Dv = Dv, dims.dtype = dt;
  dims.scale = float(s.small.softmax_scale());
  const int64_t Dn = dims.Dn;
  MlaConfig at_dt = s.small;  // dlatent as laga-fused writes it under small's --dlatent-sum
  at_dt.dtype = dt;
  const DType dlatent_dt = at_dt.dlatent_sum_dtype();
  auto make = [=](bool backward) {
    return [=]() -> std::function<void()> {
      auto t = std::make_shared<std::vector<Tensor>>();
      Tensor latent = random({T, 1, Dl}, dt, 4, "cal.latent"),
             wkv = random({Hr, Dn + Dv, Lkv}, dt, 5, "cal.wkv");
      Tensor q = random({T, 1, Hr, Dqk}, dt, 6, "cal.q"),
             o = Tensor::empty({T, 1, Hr, Dv}, dt, "cal.o");
      Tensor dout = random({T, 1, Hr, Dv}, dt, 7, "cal.do");
      Tensor dlatent = Tensor::empty({T, 1, Dl}, dlatent_dt, "cal.dlatent");
      Tensor dwkv = Tensor::zeros({Hr, Dn + Dv, Lkv}, DType::f32, "cal.dwkv");
      *t = {latent, wkv, q, o, dout, dlatent, dwkv};
      LatentAttentionBwdParams p;
      static_cast<LatentAttentionParams&>(p) = dims;
      p.latent = latent.raw(), p.wkv = wkv.raw(), p.q = q.raw(), p.o = o.raw();
      p.dout = dout.raw(), p.dlatent = dlatent.raw(), p.dlatent_dtype = dlatent.dtype();
      p.dwkv = dwkv.raw(), p.dwkv_dtype = dwkv.dtype();
      if (!backward) return [t, p] { AttentionSaved s = latent_attention_forward(p); };
      auto saved = std::make_shared<AttentionSaved>(latent_attention_forward(p));
      return [t, p, saved] { Tensor dq_sum = latent_attention_backward(p, *saved); };
    };
  };
  // FLOPs as the work ledger records the latent kernel: forward the attention and one up-projection
  // U, backward 2.5× the attention, U again (recomputed) and 2U (its dlatent and dwkv products).
  const double fl = attention_forward_flops(1, Hr, T, Dqk, Dv, true),
               up = latent_up_projection_flops(dims);
  add_attention_rates(at, "laga_fused_attention", fl + up, 2.5 * fl + 3 * up, make, ms);
}

// The sparse forms' two kernels as they call them: a row block of min(T/P, 512) queries at the end
// of the sequence (every row past k) with small's H heads and indexer, over T keys. The sparse
// attention over the k keys of each row that the indexer picks from random inputs (forward;
// backward 2.5× its FLOPs);
// the indexer's top-k over every earlier key (forward) and its loss over the selection (backward).
void add_sparse(const At& at, std::vector<Measurement>& ms) {
  const CalShape& s = at.s;
  const MlaConfig& m = s.small;
  const int64_t T = at.T, Tq = std::min<int64_t>(at.E, 512), q_pos0 = T - Tq, k = m.topk();
  const int64_t H = s.H, HI = m.index_n_heads, DI = m.index_head_dim;
  const DType dt = at.dt;
  IndexerLossParams ip;
  ip.B = 1, ip.Tq = Tq, ip.Tk = T, ip.q_pos0 = q_pos0, ip.H = HI, ip.D = DI, ip.dtype = dt;
  ip.w_scale = float(m.indexer_weight_scale()), ip.topk = k, ip.loss_scale = 1.0f;
  // the selection the indexer makes of random queries, weights and keys (as a run's from its
  // random weights)
  auto selection = std::make_shared<std::vector<int32_t>>(size_t(Tq * k), -1);
  {
    Tensor q = random({Tq, 1, HI, DI}, dt, 7, "cal.q"), w = random({Tq, 1, HI}, dt, 8, "cal.w");
    Tensor key = random({T, 1, DI}, dt, 9, "cal.k");
    IndexerParams p = ip;
    p.q = q.raw(), p.w = w.raw(), p.k = key.raw();
    indexer_topk(p, k, selection->data(), nullptr);
  }
  ip.idx = selection->data();
  SparseAttentionParams dims;
  dims.B = 1, dims.Tq = Tq, dims.Tk = T, dims.q_pos0 = q_pos0, dims.H = H, dims.Dqk = s.Dl;
  dims.Dv = s.Lkv, dims.topk = k, dims.dtype = dt, dims.scale = float(m.softmax_scale());
  dims.idx = selection->data();
  auto attention = [=](bool backward) {
    return [=]() -> std::function<void()> {
      auto t = std::make_shared<std::vector<Tensor>>();
      Tensor q = random({Tq, 1, H, s.Dl}, dt, 4, "cal.q"),
             kv = random({T, 1, s.Dl}, dt, 5, "cal.kv");
      Tensor o = Tensor::empty({Tq, 1, H, s.Lkv}, dt, "cal.o");
      Tensor dout = random({Tq, 1, H, s.Lkv}, dt, 6, "cal.do");
      Tensor dq = Tensor::empty(q.shape(), dt, "cal.dq");
      Tensor dkv = Tensor::empty(kv.shape(), DType::f32, "cal.dkv");
      *t = {q, kv, o, dout, dq, dkv};
      SparseAttentionBwdParams p;
      static_cast<SparseAttentionParams&>(p) = dims;
      p.q = q.raw(), p.kv = kv.raw(), p.o = o.raw(), p.dout = dout.raw(), p.dq = dq.raw();
      p.dkv = dkv.raw(), p.dkv_dtype = DType::f32;
      if (!backward) return [t, p, selection] { AttentionSaved a = sparse_attention_forward(p); };
      auto saved = std::make_shared<AttentionSaved>(sparse_attention_forward(p));
      return [t, p, saved, selection] { sparse_attention_backward(p, *saved); };
    };
  };
  const double fl = sparse_attention_forward_flops(dims);
  add_attention_rates(at, "sparse_attention", fl, 2.5 * fl, attention, ms);
  auto indexer = [=](bool backward) {
    return [=]() -> std::function<void()> {
      auto t = std::make_shared<std::vector<Tensor>>();
      Tensor q = random({Tq, 1, HI, DI}, dt, 7, "cal.q"), w = random({Tq, 1, HI}, dt, 8, "cal.w");
      Tensor key = random({T, 1, DI}, dt, 9, "cal.k");
      Tensor target = Tensor::empty({Tq, 1, k}, DType::f32, "cal.target");
      target.fill(1.0f / float(k));
      Tensor dq = Tensor::zeros({Tq, 1, HI, DI}, DType::f32, "cal.dq"),
             dw = Tensor::zeros({Tq, 1, HI}, DType::f32, "cal.dw");
      Tensor dk = Tensor::zeros({T, 1, DI}, DType::f32, "cal.dk");
      auto out = std::make_shared<std::vector<int32_t>>(size_t(Tq * k));
      *t = {q, w, key, target, dq, dw, dk};
      IndexerLossParams p = ip;
      p.q = q.raw(), p.w = w.raw(), p.k = key.raw(), p.target = target.data<float>();
      p.dq = dq.data<float>(), p.dw = dw.data<float>(), p.dk = dk.data<float>();
      if (!backward) return [t, p, out, k] { indexer_topk(p, k, out->data(), nullptr); };
      return [t, p, selection] { indexer_loss(p); };
    };
  };
  // FLOPs as the work ledger records them: the scores over every earlier key, and the loss's five
  // score-sized passes over the selection
  double pairs = 0;
  for (int64_t t = 0; t < Tq; ++t) pairs += double(std::min(q_pos0 + t + 1, k));
  add_attention_rates(at, "indexer_attention", indexer_score_flops(ip),
                      5 * 2.0 * double(HI) * double(DI) * pairs, indexer, ms);
}

// elementwise: rmsnorm forward (x -> y) and backward (x, dy -> dx), rope forward and backward in
// place
void add_elementwise(const At& a, std::vector<Measurement>& ms) {
  const CalShape& s = a.s;
  const int64_t E = a.E, D = s.D, H = s.H, Dr = s.Dr, P = s.P, T = a.T;
  const DType dt = a.dt;
  const double bytes = double(dtype_size(dt)) * (2.0 * E * D + 3.0 * E * D + 4.0 * E * H * Dr);
  const RopeParams rope = rope_params(s.small.rope(), dt);
  ms.push_back({fmt::format("{} T {} elementwise", a.dn, T),
                bytes,
                [=, &opt = a.opt] {
                  return timed_on_ranks(P, opt.reps, [&]() -> std::function<void()> {
                    Tensor x = random({E, D}, dt, 8, "cal.x"), w = random({D}, dt, 9, "cal.w"),
                           dy = random({E, D}, dt, 10, "cal.dy");
                    Tensor dx = Tensor::empty({E, D}, dt, "cal.dx"),
                           dw = Tensor::zeros({D}, DType::f32, "cal.dw");
                    Tensor qpe = random({E, H, Dr}, dt, 11, "cal.qpe");
                    RopeParams rp = rope;
                    rp.x = qpe.raw(), rp.T = E, rp.inner = H, rp.t_stride = H * Dr,
                    rp.inner_stride = Dr, rp.pos0 = 0;
                    // qpe is captured by name: rp only points into it.
                    return [x, w, dy, dx, dw, qpe, rp]() mutable {
                      Tensor y = rmsnorm_forward(x, w, 1e-6, "cal.y");
                      rmsnorm_backward(x, w, dy, 1e-6, dx, dw);
                      rope_forward(rp);
                      rope_backward(rp);
                    };
                  });
                },
                [&cs = a.cs, T](double r) { cs.elementwise_GBps.by_seq[T] = r; },
                Unit::GBps,
                {}});
}

// accumulate: fp32 streams, the same in a run of either dtype, stored in both dtypes' sections of
// hw. What the ring forms do to their fp32 buffers every hop, at ring-kv's width (all H heads of E
// rows): a zeroed accumulator, a partial added into it, a partial attention merged by log-sum-exp,
// the accumulator rounded to bf16. The class's copies (K/V assembly, the all-to-alls' packing) run
// at the same memory speed with no arithmetic at all, and are priced at this rate too.
void add_accumulate(const At& a, HardwareSpec& hw, std::vector<Measurement>& ms) {
  const CalShape& s = a.s;
  const int64_t E = a.E, H = s.H, Dqk = s.Dqk, Dv = s.Dv, P = s.P, T = a.T;
  const double n = double(E) * H * Dqk, o = double(E) * H * Dv;
  const double bytes = 4 * n + 12 * n + 6 * n + 12 * o + 12.0 * E * H;
  ms.push_back({fmt::format("T {} accumulate", T),
                bytes,
                [=, &opt = a.opt] {
                  return timed_on_ranks(P, opt.reps, [&]() -> std::function<void()> {
                    Tensor part = random({E, 1, H, Dqk}, DType::f32, 12, "cal.part");
                    Tensor o_part = random({E, 1, H, Dv}, DType::f32, 13, "cal.o_part");
                    Tensor o_acc = random({E, 1, H, Dv}, DType::f32, 14, "cal.o_acc");
                    Tensor lse_part = random({1, H, E}, DType::f32, 15, "cal.lse_part");
                    Tensor lse_acc = random({1, H, E}, DType::f32, 16, "cal.lse_acc");
                    Tensor rounded = Tensor::empty({E, 1, H, Dqk}, DType::bf16, "cal.rounded");
                    return [=]() mutable {
                      Tensor acc = Tensor::zeros({E, 1, H, Dqk}, DType::f32, "cal.acc");
                      add_into(acc, part);
                      attention_merge(o_part, lse_part, o_acc, lse_acc, false);
                      rounded.copy_from(acc);
                    };
                  });
                },
                [&hw, T](double r) {
                  for (DType d : {DType::bf16, DType::f32}) {
                    std::optional<SeqRate>& acc = hw.compute[d].accumulate_GBps;
                    if (!acc) acc = SeqRate{};
                    acc->by_seq[T] = r;
                  }
                },
                Unit::GBps,
                {}});
}

double rate(const Measurement& m, double secs) {
  return m.work / secs / (m.unit == Unit::GBps ? 1e9 : 1e12);
}
const char* unit(const Measurement& m) { return m.unit == Unit::GBps ? "GB/s" : "TFLOP/s"; }

// Reads every measurement in two rounds, a third where they disagree, and stores each one's rate;
// the entries read a third time, for the notes.
nlohmann::json read_all(std::vector<Measurement>& ms, const CalibrationOptions& opt,
                        const std::function<void(const std::string&)>& say) {
  for (int round = 1; round <= 2; ++round)
    for (Measurement& m : ms) {
      m.readings.push_back(m.seconds());
      say(fmt::format("round {}: {}: {:.4f} {}", round, m.what, rate(m, m.readings.back()),
                      unit(m)));
    }
  nlohmann::json remeasured = nlohmann::json::array();
  for (Measurement& m : ms) {
    const double a = m.readings[0], b = m.readings[1];
    if (std::max(a, b) > (1 + opt.agree) * std::min(a, b)) {
      m.readings.push_back(m.seconds());
      say(fmt::format(
          "round 3: {}: {:.4f} {} (rounds 1 and 2 read {:.4f} and {:.4f}: {:.0f} % apart)", m.what,
          rate(m, m.readings.back()), unit(m), rate(m, a), rate(m, b),
          100 * (std::max(a, b) / std::min(a, b) - 1)));
      nlohmann::json rs = nlohmann::json::array();
      for (double s : m.readings) rs.push_back(rate(m, s));
      remeasured.push_back({{"what", m.what}, {"rates", rs}, {"unit", unit(m)}});
    }
    m.store(rate(m, median(m.readings)));
  }
  return remeasured;
}

// The threads link into hw.intra_node, its fits into the notes.
nlohmann::json calibrate_link_notes(const CalibrationOptions& opt, HardwareSpec& hw,
                                    const std::function<void(const std::string&)>& say) {
  std::map<CollectiveOp, LatencyBandwidthFit> fits;
  hw.intra_node = calibrate_threads_link(opt.sp, std::max(opt.reps, 3), &fits);
  nlohmann::json fj;
  for (const auto& [op, f] : fits) {
    fj[std::string(collective_name(op))] = {{"latency_us", f.latency_s * 1e6},
                                            {"busbw_GBps", f.busbw_GBps},
                                            {"max_rel_residual", f.max_rel_residual},
                                            {"points", f.points}};
    say(fmt::format("link {}: latency {:.2f} us, busbw {:.3f} GB/s (max residual {:.1f} %)",
                    collective_name(op), f.latency_s * 1e6, f.busbw_GBps,
                    100 * f.max_rel_residual));
  }
  return {{"how",
           "laga's threads Communicator, bf16, S = 64 KiB .. 16 MiB, latency + bytes / busbw least "
           "squares (relative residuals)"},
          {"fits", fj}};
}

}  // namespace

// The median of a measurement's timed repeats (worst[0], the warm-up, left out): bench reports the
// median of its iterations, so the rates it is compared with are read the same way. The fastest
// repeat would bias every rate towards a quiet moment of a shared machine (the model then errs low
// on every row); one slow repeat in three moves the median not at all.
double median_after_warmup(std::vector<double> worst) {
  LAGA_ASSERT(worst.size() >= 2, "a measurement needs a warm-up and a timed repeat");
  return median(std::vector<double>(worst.begin() + 1, worst.end()));
}

double median(std::vector<double> xs) {
  LAGA_ASSERT(!xs.empty(), "the median of no values");
  std::sort(xs.begin(), xs.end());
  const size_t n = xs.size(), mid = n / 2;
  return n % 2 ? xs[mid] : (xs[mid - 1] + xs[mid]) / 2;
}

LinkSpec calibrate_threads_link(int64_t P, int reps,
                                std::map<CollectiveOp, LatencyBandwidthFit>* fits) {
  LAGA_CHECK(P >= 2, "calibrating a link needs --sp ≥ 2, got {}", P);
  const DType dt = DType::bf16;
  const int64_t es = dtype_size(dt);
  LinkSpec link;
  for (CollectiveOp op : kModelledOps) {
    std::vector<double> x, y;
    for (int64_t S = int64_t(1) << 16; S <= int64_t(1) << 24; S <<= 2) {
      // n: the count each call takes, from S (nccl-tests' size, driver/model.hpp).
      const int64_t n = (op == CollectiveOp::all_reduce) ? S / es : S / (es * P);
      const int calls = 4;
      std::vector<double> worst(size_t(reps + 1), 0);
      std::mutex mu;
      run_threads(int(P), [&](Communicator& comm) {
        std::vector<uint16_t> in(size_t(n * P)), out(size_t(n * P));
        for (int i = 0; i <= reps; ++i) {
          comm.barrier();
          const auto t0 = Clock::now();
          for (int k = 0; k < calls; ++k) switch (op) {
              case CollectiveOp::all_gather:
                comm.all_gather(in.data(), out.data(), n, dt, "calibrate");
                break;
              case CollectiveOp::reduce_scatter:
                comm.reduce_scatter(in.data(), out.data(), n, dt, "calibrate");
                break;
              case CollectiveOp::all_to_all:
                comm.all_to_all(in.data(), out.data(), n, dt, "calibrate");
                break;
              default:
                comm.all_reduce(in.data(), n, dt, "calibrate");
                break;
            }
          const double s = seconds_since(t0) / calls;
          std::lock_guard<std::mutex> lock(mu);
          worst[size_t(i)] = std::max(worst[size_t(i)], s);
        }
      });
      x.push_back(double(S) * bus_factor(op, P));
      y.push_back(median_after_warmup(std::move(worst)));
    }
    const LatencyBandwidthFit f = fit_latency_bandwidth(x, y);
    link.busbw_GBps[op] = f.busbw_GBps;
    link.latency_op_s[op] = f.latency_s;
    link.latency_s = std::max(link.latency_s, f.latency_s);
    if (fits) (*fits)[op] = f;
  }
  return link;
}

HardwareSpec calibrate_machine(const CalibrationOptions& opt) {
  const int64_t P = opt.sp;
  LAGA_CHECK(P >= 1, "--sp {} must be at least 1", P);
  LAGA_CHECK(!opt.seqs.empty(), "calibration needs at least one sequence length T, e.g. 2048");
  for (int64_t T : opt.seqs)
    LAGA_CHECK(T >= 2 * P && T % P == 0 && T <= (int64_t(1) << 17),
               "calibration at T {} with --sp {}: T must be a multiple of {} between {} and "
               "131072, e.g. 2048",
               T, P, P, 2 * P);
  auto say = [&](const std::string& s) {
    if (opt.progress) opt.progress(s);
  };
  const CalShape shape(P);
  HardwareSpec hw;
  hw.name = fmt::format("this machine, P {} (laga model --calibrate)", P);
  const MachineInfo mi = machine_info();
  hw.source = fmt::format("measured by laga model --calibrate with laga's kernels: {}", mi.line());
  hw.ranks_per_node = std::max<int64_t>(P, 1);
  nlohmann::json notes = calibration_notes(opt, shape);
  std::vector<Measurement> ms;
  for (DType dt : {DType::bf16, DType::f32})
    for (const int64_t T : opt.seqs) {
      const At at{shape, opt, dt, dt == DType::bf16 ? "bf16" : "fp32", T, T / P, hw.compute[dt]};
      add_matmul(at, ms);
      add_attention(at, ms);
      add_laga_fused(at, ms);
      add_sparse(at, ms);
      add_elementwise(at, ms);
      if (dt == DType::f32) add_accumulate(at, hw, ms);
    }
  const nlohmann::json remeasured = read_all(ms, opt, say);
  notes["rounds"] = fmt::format(
      "every rate read twice, the second round after the whole first; an entry whose two "
      "readings differ by more than {:.0f} % read a third time; each keeps the median of its "
      "readings (of two, their mean)",
      100 * opt.agree);
  notes["remeasured"] = remeasured;
  if (opt.link && P >= 2) notes["link"] = calibrate_link_notes(opt, hw, say);
  hw.notes = notes;
  return hw;
}

}  // namespace laga
