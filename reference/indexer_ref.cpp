// fp64 reference of the lightning indexer and LayerNorm (indexer_ref.hpp): plain loops, by the
// definitions of docs/sparse.md.
#include "reference/indexer_ref.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace laga::ref {

Array indexer_scores(const Array& q, const Array& w, const Array& k, double w_scale,
                     int64_t q_pos0) {
  const int64_t Tq = q.shape[0], B = q.shape[1], H = q.shape[2], D = q.shape[3], Tk = k.shape[0];
  Array I({Tq, B, Tk});
  for (int64_t t = 0; t < Tq; ++t)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < Tk; ++s) {
        double sum = 0;
        for (int64_t j = 0; j < H; ++j) {
          double a = 0;
          for (int64_t d = 0; d < D; ++d)
            a += q[((t * B + b) * H + j) * D + d] * k[(s * B + b) * D + d];
          sum += w_scale * w[(t * B + b) * H + j] * std::max(a, 0.0);
        }
        I[(t * B + b) * Tk + s] = s <= q_pos0 + t ? sum : -INFINITY;
      }
  return I;
}

IndexerSelection indexer_topk(const Array& I, int64_t topk) {
  const int64_t Tq = I.shape[0], B = I.shape[1], Tk = I.shape[2];
  IndexerSelection out;
  out.idx.assign(size_t(Tq * B * topk), -1);
  out.scores = Array({Tq, B, topk});
  for (int64_t r = 0; r < Tq * B; ++r) {
    const double* row = &I.data[size_t(r * Tk)];
    std::vector<int64_t> cand;
    for (int64_t s = 0; s < Tk; ++s)
      if (row[s] != -INFINITY) cand.push_back(s);
    std::sort(cand.begin(), cand.end(),
              [&](int64_t a, int64_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    cand.resize(size_t(std::min<int64_t>(topk, int64_t(cand.size()))));
    std::sort(cand.begin(), cand.end());
    for (int64_t i = 0; i < topk; ++i) {
      const bool has = i < int64_t(cand.size());
      out.idx[size_t(r * topk + i)] = has ? int32_t(cand[size_t(i)]) : -1;
      out.scores[r * topk + i] = has ? row[cand[size_t(i)]] : -INFINITY;
    }
  }
  return out;
}

IndexerLoss indexer_loss(const Array& q, const Array& w, const Array& k, double w_scale,
                         int64_t q_pos0, const std::vector<int32_t>* idx, int64_t topk,
                         const Array& target, double loss_scale) {
  const int64_t Tq = q.shape[0], B = q.shape[1], H = q.shape[2], D = q.shape[3], Tk = k.shape[0];
  const int64_t C = idx ? topk : Tk;
  IndexerLoss out;
  out.dq = Array(q.shape), out.dw = Array(w.shape), out.dk = Array(k.shape);
  auto a_of = [&](int64_t t, int64_t b, int64_t j, int64_t s) {
    double a = 0;
    for (int64_t d = 0; d < D; ++d) a += q[((t * B + b) * H + j) * D + d] * k[(s * B + b) * D + d];
    return a;
  };
  for (int64_t t = 0; t < Tq; ++t)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t r = t * B + b;
      std::vector<int64_t> keys, cols;  // C_t: key rows and their target columns
      for (int64_t c = 0; c < C; ++c) {
        const int64_t s = idx ? (*idx)[size_t(r * topk + c)] : c;
        if (s >= 0 && s <= q_pos0 + t) keys.push_back(s), cols.push_back(c);
      }
      const size_t n = keys.size();
      double z = 0;
      for (size_t i = 0; i < n; ++i) z += target[r * C + cols[i]];
      if (n == 0 || !(z > 0)) continue;
      std::vector<double> I(n, 0.0), p(n);
      for (size_t i = 0; i < n; ++i) {
        p[i] = target[r * C + cols[i]] / z;
        for (int64_t j = 0; j < H; ++j)
          I[i] += w_scale * w[r * H + j] * std::max(a_of(t, b, j, keys[i]), 0.0);
      }
      const double m = *std::max_element(I.begin(), I.end());
      double se = 0;
      for (double v : I) se += std::exp(v - m);
      const double lse = m + std::log(se);
      for (size_t i = 0; i < n; ++i) {
        if (p[i] > 0) out.loss += p[i] * (std::log(p[i]) - (I[i] - lse));
        // dI = loss_scale (softmax − p); I = Σ_j w_scale w_j ReLU(a_j), a_j = q_j · k_s
        const double dI = loss_scale * (std::exp(I[i] - lse) - p[i]);
        const int64_t s = keys[i];
        for (int64_t j = 0; j < H; ++j) {
          const double a = a_of(t, b, j, s);
          if (a <= 0) continue;
          out.dw[r * H + j] += dI * w_scale * a;
          const double g = dI * w_scale * w[r * H + j];
          for (int64_t d = 0; d < D; ++d) {
            out.dq[(r * H + j) * D + d] += g * k[(s * B + b) * D + d];
            out.dk[(s * B + b) * D + d] += g * q[(r * H + j) * D + d];
          }
        }
      }
    }
  return out;
}

Array layernorm_forward(const Array& x, const Array& w, const Array& b, double eps) {
  const int64_t C = x.shape.back(), M = x.numel() / C;
  Array y(x.shape);
  for (int64_t m = 0; m < M; ++m) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += x[m * C + c];
    mean /= double(C);
    for (int64_t c = 0; c < C; ++c) var += (x[m * C + c] - mean) * (x[m * C + c] - mean);
    const double rstd = 1 / std::sqrt(var / double(C) + eps);
    for (int64_t c = 0; c < C; ++c) y[m * C + c] = (x[m * C + c] - mean) * rstd * w[c] + b[c];
  }
  return y;
}

LayerNormGrads layernorm_backward(const Array& x, const Array& w, const Array& dy, double eps) {
  const int64_t C = x.shape.back(), M = x.numel() / C;
  LayerNormGrads g{Array(x.shape), Array({C}), Array({C})};
  for (int64_t m = 0; m < M; ++m) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += x[m * C + c];
    mean /= double(C);
    for (int64_t c = 0; c < C; ++c) var += (x[m * C + c] - mean) * (x[m * C + c] - mean);
    const double rstd = 1 / std::sqrt(var / double(C) + eps);
    // x̂ = (x − μ) r, gy = dy · w: dx = r (gy − mean(gy) − x̂ mean(gy x̂))
    double mg = 0, mgx = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double xh = (x[m * C + c] - mean) * rstd, gy = dy[m * C + c] * w[c];
      mg += gy / double(C), mgx += gy * xh / double(C);
      g.dw[c] += dy[m * C + c] * xh;
      g.db[c] += dy[m * C + c];
    }
    for (int64_t c = 0; c < C; ++c) {
      const double xh = (x[m * C + c] - mean) * rstd;
      g.dx[m * C + c] = rstd * (dy[m * C + c] * w[c] - mg - xh * mgx);
    }
  }
  return g;
}

}  // namespace laga::ref
