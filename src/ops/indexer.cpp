// The lightning indexer (ops/indexer.hpp): index scores fused over the index heads, the causal
// top-k selection per query row, and the indexer's KL loss with its gradient. Every score goes
// through the micro-kernels of indexer_kernel.hpp, whose arithmetic per (row, key) is one fixed
// FMA order wherever the key sits in its tile; this file adds the tiling, the selection and the
// gradient products. Derivation: docs/sparse.md. Nothing [Tq, Tk] is allocated: workspaces are a
// fixed number of per-thread slots of row- and tile-sized buffers, sized from the params alone.
//
// Parallel over tasks that write outputs no other task writes, each single-threaded inside:
//   indexer_topk   task (b, tile of kRowTile query rows): key tiles in position order, a running
//                  top-k per row
//   indexer_loss   pass 1, task (b, block of kLossRows query rows): per row the scores of C_t, the
//                  log-softmax, KL, dI, then dw and dq of the row (recomputed products per tile)
//                  pass 2, task (b, range of 1–8 key tiles, wider where the selection is
//                  sparse among the keys): dk of the range's keys, summed over the rows t = 0,
//                  1, ... in order (recomputing the products of every (t, s) pair of the range)
// so every result is bitwise independent of the thread count. It does not run the projections
// (wq_b, wk, k_norm, weights_proj) nor the sparse attention.
#include "laga/ops/indexer.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "laga/core/error.hpp"
#include "laga/core/memory.hpp"
#include "laga/core/work.hpp"
#include "laga/ops/attention.hpp"
#include "laga/ops/matmul.hpp"
#include "src/ops/attention_internal.hpp"
#include "src/ops/indexer_kernel.hpp"

namespace laga {

namespace {

using indexer::kTileKeys;
constexpr int64_t kRowTile = 16;   // query rows of a top-k task
constexpr int64_t kLossRows = 16;  // query rows of a loss task (pass 1)
// Per-thread workspaces: a constant, not the thread count (memory depends on the params alone).
constexpr int64_t kMaxSlots = kAttentionMaxThreads;

using attn::parallel_tasks;

struct Cand {
  float score;
  int32_t pos;
};
// The selection's order: the larger score first, then the lower position.
inline bool better(const Cand& a, const Cand& b) {
  return a.score > b.score || (a.score == b.score && a.pos < b.pos);
}

// How a call computes its products: in fp32 from widened inputs, or, for bf16 storage on a CPU
// with a bf16 dot product, from bf16 pairs (indexer_kernel.hpp). Its query operand and key tiles
// are laid out for its path: fp32 [H, D] and [D, kTileKeys], or uint32 pairs [H, D2] and [D2,
// kTileKeys] in the same buffers.
struct Scorer {
  const indexer::Kernels& k;
  bool pairs;
  int64_t H, D, D2;
  explicit Scorer(const IndexerParams& p)
      : k(indexer::kernels()),
        pairs(p.dtype == DType::bf16 && k.scores_bf16),
        H(p.H),
        D(p.D),
        D2((p.D + 1) / 2) {}
  void scores(const void* qx, const float* c, const float* kt, int64_t n, float* out) const {
    if (pairs)
      k.scores_bf16(static_cast<const uint32_t*>(qx), c, reinterpret_cast<const uint32_t*>(kt), H,
                    D2, n, out);
    else
      k.scores(static_cast<const float*>(qx), c, kt, H, D, n, out);
  }
  void products(const void* qx, const float* kt, int64_t n, float* a) const {
    if (pairs)
      k.products_bf16(static_cast<const uint32_t*>(qx), reinterpret_cast<const uint32_t*>(kt), H,
                      D2, n, a);
    else
      k.products(static_cast<const float*>(qx), kt, H, D, n, a);
  }
};

// Elements 2e and 2e + 1 of a bf16 row of D as one pair (0 past D).
template <class T>
uint32_t pair_of(const T* x, int64_t e, int64_t D) {
  if constexpr (std::is_same_v<T, bf16>)
    return uint32_t(x[2 * e].bits) | (2 * e + 1 < D ? uint32_t(x[2 * e + 1].bits) << 16 : 0u);
  else
    return 0;  // fp32 storage never takes the pair path
}

// The query row (t, b): qf [H, D] widened to fp32, on the pair path also q2 [H, D2] its pairs, and
// c [H] = w_scale · w[t, b, j] in fp32.
template <class T>
void load_row(const IndexerParams& p, const Scorer& sc, int64_t t, int64_t b, float* qf,
              uint32_t* q2, float* c) {
  const T* q = static_cast<const T*>(p.q) + (t * p.B + b) * p.H * p.D;
  const T* w = static_cast<const T*>(p.w) + (t * p.B + b) * p.H;
  for (int64_t i = 0; i < p.H * p.D; ++i) qf[i] = to_float(q[i]);
  if (sc.pairs)
    for (int64_t j = 0; j < p.H; ++j)
      for (int64_t e = 0; e < sc.D2; ++e) q2[j * sc.D2 + e] = pair_of(q + j * p.D, e, p.D);
  for (int64_t j = 0; j < p.H; ++j) c[j] = p.w_scale * to_float(w[j]);
}
// The query operand of the row load_row filled.
inline const void* operand(const Scorer& sc, const float* qf, const uint32_t* q2) {
  return sc.pairs ? static_cast<const void*>(q2) : static_cast<const void*>(qf);
}

// kt [D, kTileKeys] (pairs: [D2, kTileKeys]) = the n ≤ kTileKeys keys pos[0 .. n) (or s0, s0 + 1,
// ... when pos is null) of batch b, transposed, 0 in the columns past n; kr [n, D] (when not null)
// the same rows untransposed in fp32.
template <class T>
void pack_keys(const IndexerParams& p, const Scorer& sc, int64_t b, const int32_t* pos, int64_t s0,
               int64_t n, float* kt, float* kr) {
  const T* k = static_cast<const T*>(p.k);
  uint32_t* kt2 = reinterpret_cast<uint32_t*>(kt);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = pos ? pos[i] : s0 + i;
    const T* row = k + (s * p.B + b) * p.D;
    if (sc.pairs)
      for (int64_t e = 0; e < sc.D2; ++e) kt2[e * kTileKeys + i] = pair_of(row, e, p.D);
    else
      for (int64_t d = 0; d < p.D; ++d) kt[d * kTileKeys + i] = to_float(row[d]);
    if (kr)
      for (int64_t d = 0; d < p.D; ++d) kr[i * p.D + d] = to_float(row[d]);
  }
  if (n < kTileKeys) {
    if (sc.pairs)
      for (int64_t e = 0; e < sc.D2; ++e)
        std::fill(kt2 + e * kTileKeys + n, kt2 + (e + 1) * kTileKeys, 0u);
    else
      for (int64_t d = 0; d < p.D; ++d)
        std::fill(kt + d * kTileKeys + n, kt + (d + 1) * kTileKeys, 0.f);
  }
}

// ---- top-k ----------------------------------------------------------------------------------

template <class T>
void topk_impl(const IndexerParams& p, const Scorer& scorer, int64_t topk, int32_t* idx,
               float* scores, float* qf, uint32_t* q2, float* cw, float* kt, float* sc, Cand* buf,
               int64_t b, int64_t t0, int64_t nr) {
  const int64_t HD = p.H * p.D, cap = 2 * topk;
  for (int64_t r = 0; r < nr; ++r)
    load_row<T>(p, scorer, t0 + r, b, qf + r * HD, q2 + r * HD, cw + r * p.H);
  std::vector<int64_t> size(size_t(nr), 0);
  std::vector<float> thr(size_t(nr), -INFINITY);
  std::vector<char> full(size_t(nr), 0);
  // Keeps the topk best of row r's buffer (its k-th best becomes the entry threshold: a later key
  // has a higher position, so it enters only with a strictly larger score).
  auto prune = [&](int64_t r) {
    Cand* c = buf + r * cap;
    std::nth_element(c, c + topk - 1, c + size[r], better);
    size[r] = topk, thr[r] = c[topk - 1].score, full[r] = 1;
  };
  const int64_t last = p.q_pos0 + t0 + nr - 1;  // the last position any row sees
  for (int64_t k0 = 0; k0 <= last; k0 += kTileKeys) {
    const int64_t nk = std::min(kTileKeys, last + 1 - k0);
    pack_keys<T>(p, scorer, b, nullptr, k0, nk, kt, nullptr);
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t pos = p.q_pos0 + t0 + r;
      if (pos < k0) continue;
      const int64_t n = std::min(nk, pos - k0 + 1);
      scorer.scores(operand(scorer, qf + r * HD, q2 + r * HD), cw + r * p.H, kt, n, sc);
      Cand* c = buf + r * cap;
      for (int64_t i = 0; i < n; ++i) {
        if (full[r] && !(sc[i] > thr[r])) continue;
        c[size[r]++] = {sc[i], int32_t(k0 + i)};
        if (size[r] == cap) prune(r);
      }
    }
  }
  for (int64_t r = 0; r < nr; ++r) {
    Cand* c = buf + r * cap;
    if (size[r] > topk) prune(r);
    std::sort(c, c + size[r], [](const Cand& a, const Cand& b) { return a.pos < b.pos; });
    int32_t* ir = idx + ((t0 + r) * p.B + b) * topk;
    float* sr = scores ? scores + ((t0 + r) * p.B + b) * topk : nullptr;
    for (int64_t i = 0; i < topk; ++i) {
      ir[i] = i < size[r] ? c[i].pos : -1;
      if (sr) sr[i] = i < size[r] ? c[i].score : -INFINITY;
    }
  }
}

// ---- loss -----------------------------------------------------------------------------------

// One slot's buffers of the loss (both passes).
struct LossSlot {
  float *qf, *cw, *kt, *kr, *a,
      *I;               // [H·D], [H], [D, kTileKeys], [kTileKeys, D], [H, kTileKeys], [C]
  int32_t *cand, *col;  // [C] key rows and target columns of a candidate list
  uint32_t* q2;         // [H·D] the query row's pairs (the pair path)
  float* g;             // [H, kTileKeys] or [kTileKeys, H] the chunk's dI_s c_j [a_js > 0]
};

// The product C [M, N] fp32 (=, or += when accumulate) = A [M, K] · B [K, N], fp32 operands dense
// in rows (a_m and b_k apart): a single-threaded oneDNN product inside a task, its bits a function
// of the shape alone (ops/matmul.hpp).
MatmulParams product(int64_t M, int64_t N, int64_t K, const float* a, int64_t a_m, int64_t a_k,
                     const float* b, int64_t b_k, float* c, bool accumulate) {
  MatmulParams mp;
  mp.M = M, mp.N = N, mp.K = K;
  mp.a = a, mp.a_m_stride = a_m, mp.a_k_stride = a_k;
  mp.b = b, mp.b_k_stride = b_k, mp.b_n_stride = 1;
  mp.c = c, mp.c_m_stride = N, mp.c_n_stride = 1;
  mp.accumulate = accumulate;
  return mp;
}

// The candidates of row (t, b) among key rows [lo, hi): their key rows and target columns.
int64_t candidates(const IndexerLossParams& p, int64_t t, int64_t b, int64_t lo, int64_t hi,
                   int32_t* cand, int32_t* col) {
  const int64_t pos = p.q_pos0 + t;
  hi = std::min(hi, pos + 1);
  int64_t n = 0;
  if (!p.idx) {
    for (int64_t s = lo; s < hi; ++s) cand[n] = int32_t(s), col[n] = int32_t(s), ++n;
    return n;
  }
  const int32_t* ir = p.idx + (t * p.B + b) * p.topk;
  for (int64_t c = 0; c < p.topk; ++c)
    if (ir[c] >= lo && ir[c] < hi) cand[n] = ir[c], col[n] = int32_t(c), ++n;
  return n;
}

// dI of candidate i from its score: loss_scale · (softmax − p), p = target / z.
inline float grad_of(const IndexerLossParams& p, float I, float lse, float z, float target) {
  const double soft = std::exp(double(I) - double(lse));
  return float(double(p.loss_scale) * (soft - double(target) / double(z)));
}

// Pass 1 on row (t, b): the scores of C_t, the row's lse, z and KL into stats [3], dw and dq.
template <class T>
void loss_row(const IndexerLossParams& p, const LossSlot& w, int64_t t, int64_t b, float* stats) {
  const Scorer sc(p);
  const int64_t C = p.idx ? p.topk : p.Tk;
  const int64_t n = candidates(p, t, b, 0, p.Tk, w.cand, w.col);
  stats[0] = stats[1] = stats[2] = 0;
  if (n == 0) return;
  const float* target = p.target + (t * p.B + b) * C;
  double zs = 0;
  for (int64_t i = 0; i < n; ++i) zs += target[w.col[i]];
  const float z = float(zs);
  if (!(z > 0)) return;  // no target mass: the row has no distribution to match
  load_row<T>(p, sc, t, b, w.qf, w.q2, w.cw);
  // I = Σ_j c_j ReLU(q_j·k_s) over C_t, then log-softmax: lse = m + log Σ exp(I − m).
  for (int64_t i0 = 0; i0 < n; i0 += kTileKeys) {
    const int64_t m = std::min(kTileKeys, n - i0);
    pack_keys<T>(p, sc, b, w.cand + i0, 0, m, w.kt, nullptr);
    sc.scores(operand(sc, w.qf, w.q2), w.cw, w.kt, m, w.I + i0);
  }
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, w.I[i]);
  double se = 0;
  for (int64_t i = 0; i < n; ++i) se += std::exp(double(w.I[i]) - double(mx));
  const float lse = float(double(mx) + std::log(se));
  // KL = Σ p (log p − log q), log q = I − lse; 0 · log 0 = 0.
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double pi = double(target[w.col[i]]) / double(z);
    if (pi > 0) kl += pi * (std::log(pi) - (double(w.I[i]) - double(lse)));
  }
  stats[0] = lse, stats[1] = z, stats[2] = float(kl);
  // dI_s = loss_scale (softmax_s − p_s); I = Σ_j c_j ReLU(a_js) with c_j = w_scale w_j:
  //   dw_j += w_scale Σ_s dI_s ReLU(a_js),  dq_j += Σ_s dI_s c_j [a_js > 0] k_s
  std::vector<double> dc(size_t(p.H), 0.0);
  float* dq = p.dq + (t * p.B + b) * p.H * p.D;
  for (int64_t i0 = 0; i0 < n; i0 += kTileKeys) {
    const int64_t m = std::min(kTileKeys, n - i0);
    pack_keys<T>(p, sc, b, w.cand + i0, 0, m, w.kt, w.kr);
    sc.products(operand(sc, w.qf, w.q2), w.kt, m, w.a);
    float dI[kTileKeys];
    for (int64_t i = 0; i < m; ++i) dI[i] = grad_of(p, w.I[i0 + i], lse, z, target[w.col[i0 + i]]);
    // G [H, m] = dI_s c_j [a_js > 0], then dq [H, D] += G · k_C [m, D] (one product per chunk)
    for (int64_t j = 0; j < p.H; ++j) {
      const float* aj = w.a + j * kTileKeys;
      float* gj = w.g + j * kTileKeys;
      for (int64_t i = 0; i < m; ++i) {
        const bool on = aj[i] > 0;
        if (on) dc[size_t(j)] += double(dI[i]) * double(aj[i]);
        gj[i] = on ? dI[i] * w.cw[j] : 0.f;
      }
    }
    matmul(product(p.H, p.D, m, w.g, kTileKeys, 1, w.kr, p.D, dq, true));
  }
  float* dw = p.dw + (t * p.B + b) * p.H;
  for (int64_t j = 0; j < p.H; ++j) dw[j] += float(double(p.w_scale) * dc[size_t(j)]);
}

// Pass 2 on key tile [k0, k0 + nk) of batch b: dk_s += Σ_t Σ_j dI_ts c_tj [a_tjs > 0] q_tj, rows t
// in ascending order, each (t, s) pair's products and score recomputed as pass 1 computed them.
template <class T>
void loss_keys(const IndexerLossParams& p, const LossSlot& w, int64_t b, int64_t k0, int64_t nk,
               const float* stats) {
  const Scorer sc(p);
  const int64_t C = p.idx ? p.topk : p.Tk;
  for (int64_t t = 0; t < p.Tq; ++t) {
    if (p.q_pos0 + t < k0) continue;
    const float* st = stats + (t * p.B + b) * 3;
    if (!(st[1] > 0)) continue;  // no candidates or no target mass: pass 1 made no gradient
    const int64_t n = candidates(p, t, b, k0, k0 + nk, w.cand, w.col);
    if (n == 0) continue;
    const float* target = p.target + (t * p.B + b) * C;
    load_row<T>(p, sc, t, b, w.qf, w.q2, w.cw);
    for (int64_t i0 = 0; i0 < n; i0 += kTileKeys) {
      const int64_t m = std::min(kTileKeys, n - i0);
      pack_keys<T>(p, sc, b, w.cand + i0, 0, m, w.kt, nullptr);
      sc.products(operand(sc, w.qf, w.q2), w.kt, m, w.a);
      for (int64_t i = 0; i < m; ++i) {
        // the score as the kernel sums it: I = fma(c_j, ReLU(a_j), I), j = 0 .. H−1
        float I = 0;
        for (int64_t j = 0; j < p.H; ++j)
          I = std::fma(w.cw[j], std::max(w.a[j * kTileKeys + i], 0.f), I);
        const float dI = grad_of(p, I, st[0], st[1], target[w.col[i0 + i]]);
        // Gᵀ [m, H]: dI_s c_j [a_js > 0]
        for (int64_t j = 0; j < p.H; ++j)
          w.g[i * p.H + j] = w.a[j * kTileKeys + i] > 0 ? dI * w.cw[j] : 0.f;
      }
      // dk_C [m, D] += Gᵀ · q [H, D]: the chunk's product into kr, added row by row
      matmul(product(m, p.D, p.H, w.g, p.H, 1, w.qf, p.D, w.kr, false));
      for (int64_t i = 0; i < m; ++i) {
        float* dks = p.dk + (int64_t(w.cand[i0 + i]) * p.B + b) * p.D;
        const float* src = w.kr + i * p.D;
        for (int64_t d = 0; d < p.D; ++d) dks[d] += src[d];
      }
    }
  }
}

WorkRecord indexer_work(const IndexerParams& p, WorkClass cls, double flops) {
  WorkRecord r;
  r.cls = cls, r.op = "indexer", r.dtype = p.dtype, r.flops = flops;
  r.dims[0] = p.Tq, r.dims[1] = p.H, r.dims[2] = 1, r.dims[3] = p.D, r.dims[4] = 0;
  r.kernel = AttentionKernel::indexer;
  return r;
}

// Candidate pairs (t, s) of a loss call per batch row: Σ_t |C_t| at most (idx: min(pos + 1, topk)).
double loss_pairs(const IndexerLossParams& p) {
  double n = 0;
  for (int64_t t = 0; t < p.Tq; ++t)
    n += double(p.idx ? std::min(p.q_pos0 + t + 1, p.topk) : p.q_pos0 + t + 1);
  return n;
}

}  // namespace

void check_indexer_params(const IndexerParams& p) {
  LAGA_CHECK(p.B >= 1 && p.Tq >= 1 && p.Tk >= 1,
             "indexer needs B ≥ 1, Tq ≥ 1 and Tk ≥ 1; got B {}, Tq {}, Tk {}", p.B, p.Tq, p.Tk);
  LAGA_CHECK(p.Tk <= INT32_MAX, "indexer key rows Tk {} exceed int32 indices (at most {})", p.Tk,
             INT32_MAX);
  LAGA_CHECK(p.q_pos0 >= 0 && p.q_pos0 + p.Tq <= p.Tk,
             "indexer query rows [{}, {}) (q_pos0 {}, Tq {}) must lie within the Tk {} key rows",
             p.q_pos0, p.q_pos0 + p.Tq, p.q_pos0, p.Tq, p.Tk);
  LAGA_CHECK(p.H >= 1 && p.D >= 1, "indexer needs H ≥ 1 and D ≥ 1; got H {}, D {}", p.H, p.D);
  LAGA_CHECK(p.dtype == DType::f32 || p.dtype == DType::bf16,
             "indexer q, w and k must be fp32 or bf16; got {}", dtype_name(p.dtype));
  LAGA_CHECK(std::isfinite(p.w_scale), "indexer w_scale {} must be finite (H^-1/2 · D^-1/2)",
             p.w_scale);
  LAGA_CHECK(p.q && p.w && p.k,
             "indexer needs q [Tq, B, H, D], w [Tq, B, H] and k [Tk, B, D]; "
             "missing {}{}{}",
             p.q ? "" : "q ", p.w ? "" : "w ", p.k ? "" : "k ");
}

double indexer_score_flops(const IndexerParams& p) {
  // Σ_t (q_pos0 + t + 1) causal pairs per batch row
  const double pairs = double(p.Tq) * double(p.q_pos0 + 1) + double(p.Tq) * double(p.Tq - 1) / 2;
  return 2.0 * double(p.H) * double(p.D) * double(p.B) * pairs;
}

void indexer_topk(const IndexerParams& p, int64_t topk, int32_t* idx, float* scores) {
  WorkOp work(indexer_work(p, WorkClass::attention_forward, indexer_score_flops(p)));
  check_indexer_params(p);
  LAGA_CHECK(topk >= 1 && topk <= INT32_MAX / 2, "indexer topk {} must be in [1, 2^30)", topk);
  LAGA_CHECK(idx, "indexer_topk needs idx [Tq, B, topk] int32");
  const int64_t nt = (p.Tq + kRowTile - 1) / kRowTile, tasks = p.B * nt;
  const int64_t slots = std::min(kMaxSlots, tasks), rows = std::min(kRowTile, p.Tq);
  // per slot: q rows [rows, H, D] in fp32 and as bf16 pairs, head weights [rows, H], key tile [D,
  // kTileKeys], one row's scores [kTileKeys], candidate buffers [rows, 2·topk] of (score, position)
  Tensor qf = Tensor::empty({slots, rows * p.H * p.D}, DType::f32, "indexer.q");
  Tensor q2 = Tensor::empty({slots, rows * p.H * p.D}, DType::i32, "indexer.q_pairs");
  Tensor cw = Tensor::empty({slots, rows * p.H}, DType::f32, "indexer.w");
  Tensor kt = Tensor::empty({slots, p.D * kTileKeys}, DType::f32, "indexer.k_tile");
  Tensor sc = Tensor::empty({slots, kTileKeys}, DType::f32, "indexer.scores");
  Tensor buf = Tensor::empty({slots, rows * 2 * topk * 2}, DType::i32, "indexer.candidates");
  if (meta_mode()) return;
  const Scorer scorer(p);
  dispatch_dtype(p.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    parallel_tasks(tasks, slots, [&](int64_t slot, int64_t task) {
      const int64_t i = nt - 1 - task / p.B, b = task % p.B;  // the longest rows first
      const int64_t t0 = i * kRowTile, nr = std::min(kRowTile, p.Tq - t0);
      topk_impl<T>(p, scorer, topk, idx, scores, qf.data<float>() + slot * rows * p.H * p.D,
                   reinterpret_cast<uint32_t*>(q2.data<int32_t>()) + slot * rows * p.H * p.D,
                   cw.data<float>() + slot * rows * p.H, kt.data<float>() + slot * p.D * kTileKeys,
                   sc.data<float>() + slot * kTileKeys,
                   reinterpret_cast<Cand*>(buf.data<int32_t>() + slot * rows * 2 * topk * 2), b, t0,
                   nr);
    });
  });
}

double indexer_loss(const IndexerLossParams& p) {
  // pass 1 computes the scores twice (softmax, then the products again for dw and dq), pass 2 once
  // more, and the two gradient products dq and dk cost as much as one score computation each
  const double flops = 2.0 * double(p.H) * double(p.D) * double(p.B) * loss_pairs(p);
  WorkOp work(indexer_work(p, WorkClass::attention_backward, 5 * flops));
  check_indexer_params(p);
  LAGA_CHECK(!p.idx || (p.topk >= 1 && p.topk <= INT32_MAX),
             "indexer_loss with idx needs topk ≥ 1; got {}", p.topk);
  LAGA_CHECK(p.target && p.dq && p.dw && p.dk,
             "indexer_loss needs target, dq, dw and dk; missing {}{}{}{}",
             p.target ? "" : "target ", p.dq ? "" : "dq ", p.dw ? "" : "dw ", p.dk ? "" : "dk ");
  const int64_t C = p.idx ? p.topk : p.Tk;
  // Pass 2's keys per task: whole key tiles, enough that a row's selection (spread over up to Tk
  // earlier keys) puts about 16 of its topk keys in each range it touches, at most 8 tiles; one
  // tile without idx (a row's candidates are then every key of the tile).
  const int64_t KR =
      p.idx ? kTileKeys * std::clamp<int64_t>(16 * p.Tk / std::max<int64_t>(p.topk, 1) / kTileKeys,
                                              1, 8)
            : kTileKeys;
  const int64_t nrb = (p.Tq + kLossRows - 1) / kLossRows, nkt = (p.Tk + KR - 1) / KR;
  const int64_t tasks1 = p.B * nrb, tasks2 = p.B * nkt;
  const int64_t slots = std::min(kMaxSlots, std::max(tasks1, tasks2));
  const int64_t HD = p.H * p.D;
  // per slot: q row [H, D] in fp32 and as bf16 pairs, head weights [H], key tile [D, kTileKeys] and
  // its rows [kTileKeys, D], products and their gradient [H, kTileKeys] each, scores [C +
  // kTileKeys], candidate key rows and target columns [C] each; per row: lse, z and KL [Tq, B, 3]
  Tensor qf = Tensor::empty({slots, HD}, DType::f32, "indexer.q");
  Tensor q2 = Tensor::empty({slots, HD}, DType::i32, "indexer.q_pairs");
  Tensor cw = Tensor::empty({slots, p.H}, DType::f32, "indexer.w");
  Tensor kt = Tensor::empty({slots, p.D * kTileKeys}, DType::f32, "indexer.k_tile");
  Tensor kr = Tensor::empty({slots, kTileKeys * p.D}, DType::f32, "indexer.k_rows");
  Tensor a = Tensor::empty({slots, p.H * kTileKeys}, DType::f32, "indexer.products");
  Tensor g = Tensor::empty({slots, p.H * kTileKeys}, DType::f32, "indexer.grad");
  // the scores' last tile writes whole vectors, up to kTileKeys past C
  Tensor I = Tensor::empty({slots, C + kTileKeys}, DType::f32, "indexer.scores");
  Tensor cand = Tensor::empty({slots, 2 * C}, DType::i32, "indexer.candidates");
  Tensor stats = Tensor::empty({p.Tq, p.B, 3}, DType::f32, "indexer.row_stats");
  if (meta_mode()) return 0;
  auto slot_of = [&](int64_t s) {
    return LossSlot{qf.data<float>() + s * HD,
                    cw.data<float>() + s * p.H,
                    kt.data<float>() + s * p.D * kTileKeys,
                    kr.data<float>() + s * kTileKeys * p.D,
                    a.data<float>() + s * p.H * kTileKeys,
                    I.data<float>() + s * (C + kTileKeys),
                    cand.data<int32_t>() + s * 2 * C,
                    cand.data<int32_t>() + s * 2 * C + C,
                    reinterpret_cast<uint32_t*>(q2.data<int32_t>()) + s * HD,
                    g.data<float>() + s * p.H * kTileKeys};
  };
  float* st = stats.data<float>();
  dispatch_dtype(p.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    parallel_tasks(tasks1, slots, [&](int64_t slot, int64_t task) {
      const int64_t i = nrb - 1 - task / p.B, b = task % p.B;
      const LossSlot w = slot_of(slot);
      for (int64_t t = i * kLossRows; t < std::min(p.Tq, (i + 1) * kLossRows); ++t)
        loss_row<T>(p, w, t, b, st + (t * p.B + b) * 3);
    });
    parallel_tasks(tasks2, slots, [&](int64_t slot, int64_t task) {
      const int64_t j = task / p.B, b = task % p.B;
      loss_keys<T>(p, slot_of(slot), b, j * KR, std::min(KR, p.Tk - j * KR), st);
    });
  });
  double L = 0;
  for (int64_t r = 0; r < p.Tq * p.B; ++r) L += double(st[r * 3 + 2]);
  return L;
}

}  // namespace laga
