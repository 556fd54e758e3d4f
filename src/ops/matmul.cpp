#include "laga/ops/matmul.hpp"

#include <dnnl.hpp>

#include <string>
#include <unordered_map>

#include "laga/core/error.hpp"
#include "laga/core/memory.hpp"
#include "laga/core/profile.hpp"
#include "laga/core/progress.hpp"

namespace laga {

namespace {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::memory::data_type dnnl_type(DType t) {
  return t == DType::f32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
}

struct Cached {
  dnnl::matmul prim;
  dnnl::memory a, b, c;
  dnnl::memory scratch;  // oneDNN's scratchpad for this product (its desc may be empty)
  size_t scratch_bytes = 0;
};

// oneDNN's scratchpad, managed here (scratchpad_mode::user) instead of by the library: one block per
// thread, grown as needed, taken from the caching allocator and given back when the thread ends. A
// rank's thread lives for one run; with the library's own per-thread scratchpad every run paid the
// first touch of fresh pages again — 0.23 s of a 0.29 s product for the 4096×4096×512 bf16
// up-projection (gemm:jit accumulates a bf16 output in an fp32 scratchpad of M×N), measured by
// `laga bench --profile`. The next run's thread gets the same pages back from the cache.
class Scratchpad {
 public:
  ~Scratchpad() {
    if (p_) pool_release(p_, n_);
  }
  void* get(size_t bytes) {
    if (bytes <= n_) return p_;
    if (p_) pool_release(p_, n_);
    p_ = pool_allocate(bytes), n_ = bytes;
    LAGA_CHECK(p_, "out of memory: oneDNN's matmul scratchpad of {} bytes", bytes);
    return p_;
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

std::string key_of(const MatmulParams& p) {
  return fmt::format("{},{},{},{},{},{}|{},{},{}|{},{},{}|{},{},{}|{},{}", p.batch, p.M, p.N, p.K, int(p.ab_dtype),
                     int(p.c_dtype), p.a_batch_stride, p.a_m_stride, p.a_k_stride, p.b_batch_stride, p.b_k_stride,
                     p.b_n_stride, p.c_batch_stride, p.c_m_stride, p.c_n_stride, p.alpha, p.accumulate);
}

Cached make(const MatmulParams& p) {
  using dims = dnnl::memory::dims;
  auto md = [&](int64_t d0, int64_t d1, int64_t s_b, int64_t s0, int64_t s1, DType t) {
    return dnnl::memory::desc(dims{p.batch, d0, d1}, dnnl_type(t), dims{p.batch > 1 ? s_b : d0 * d1, s0, s1});
  };
  auto a_md = md(p.M, p.K, p.a_batch_stride, p.a_m_stride, p.a_k_stride, p.ab_dtype);
  auto b_md = md(p.K, p.N, p.b_batch_stride, p.b_k_stride, p.b_n_stride, p.ab_dtype);
  auto c_md = md(p.M, p.N, p.c_batch_stride, p.c_m_stride, p.c_n_stride, p.c_dtype);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (p.alpha != 1.0f) attr.set_output_scales(0, {p.alpha});
  if (p.accumulate) {
    dnnl::post_ops po;
    po.append_sum(1.0f);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), attr, engine());
  } catch (const dnnl::error& e) {
    LAGA_ASSERT(false, "oneDNN has no matmul for batch {} M {} N {} K {} ({} -> {}): {}", p.batch, p.M, p.N, p.K,
                dtype_name(p.ab_dtype), dtype_name(p.c_dtype), e.what());
  }
  Cached c{dnnl::matmul(pd), dnnl::memory(a_md, engine(), DNNL_MEMORY_NONE), dnnl::memory(b_md, engine(), DNNL_MEMORY_NONE),
           dnnl::memory(c_md, engine(), DNNL_MEMORY_NONE), dnnl::memory(pd.scratchpad_desc(), engine(), DNNL_MEMORY_NONE),
           pd.scratchpad_desc().get_size()};
  return c;
}

}  // namespace

void matmul(const MatmulParams& p) {
  if (p.batch == 0 || p.M == 0 || p.N == 0) return;
  if (p.K == 0) {
    LAGA_ASSERT(p.accumulate, "matmul with K = 0 and overwrite is not supported");
    return;
  }
  OpTimer timer(ProfiledOp::matmul, 2.0 * double(p.batch) * double(p.M) * double(p.N) * double(p.K));
  if (timer.recording())
    timer.set_shape(p.batch > 1 ? fmt::format("{}×{}×{}×{} {}", p.batch, p.M, p.N, p.K, dtype_name(p.ab_dtype))
                                : fmt::format("{}×{}×{} {}", p.M, p.N, p.K, dtype_name(p.ab_dtype)));
  thread_local std::unordered_map<std::string, Cached> cache;
  thread_local dnnl::stream stream(engine());
  std::string key = key_of(p);
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() > 4096) cache.clear();
    it = cache.emplace(key, make(p)).first;
  }
  Cached& c = it->second;
  c.a.set_data_handle(const_cast<void*>(p.a));
  c.b.set_data_handle(const_cast<void*>(p.b));
  c.c.set_data_handle(p.c);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_SRC, c.a}, {DNNL_ARG_WEIGHTS, c.b}, {DNNL_ARG_DST, c.c}};
  if (c.scratch_bytes) {
    thread_local Scratchpad scratch;
    c.scratch.set_data_handle(scratch.get(c.scratch_bytes));
    args.emplace(DNNL_ARG_SCRATCHPAD, c.scratch);
  }
  c.prim.execute(stream, args);
  stream.wait();
  progress_point();
}

MatView MatView::t() const {
  MatView v = *this;
  v.transposed = !transposed;
  return v;
}

MatView MatView::col_slice(int64_t begin, int64_t end) const {
  LAGA_ASSERT(!transposed && 0 <= begin && begin <= end && end <= cols, "column slice [{}, {}) of a {}-column view",
              begin, end, cols);
  MatView v = *this;
  v.data = static_cast<char*>(data) + begin * dtype_size(dtype);
  v.cols = end - begin;
  return v;
}

MatView mat(const Tensor& t) {
  const int64_t last = t.rank() ? t.dim(-1) : 1;
  return MatView{t.raw(), last ? t.numel() / last : 0, last, last, t.dtype()};
}

void matmul_2d(const MatView& a, const MatView& b, const MatView& c, bool accumulate, float alpha) {
  // Logical shapes: op(A) [M, K], op(B) [K, N], C [M, N].
  const int64_t M = a.transposed ? a.cols : a.rows, K = a.transposed ? a.rows : a.cols;
  const int64_t N = b.transposed ? b.rows : b.cols, Kb = b.transposed ? b.cols : b.rows;
  LAGA_ASSERT(!c.transposed && Kb == K && c.rows == M && c.cols == N && a.dtype == b.dtype,
              "matmul_2d: op(A) [{}, {}], op(B) [{}, {}], C [{}, {}]", M, K, Kb, N, c.rows, c.cols);
  if (meta_mode()) return;
  MatmulParams p;
  p.M = M, p.N = N, p.K = K;
  p.ab_dtype = a.dtype, p.c_dtype = c.dtype;
  p.a = a.data;
  p.a_m_stride = a.transposed ? 1 : a.ld;
  p.a_k_stride = a.transposed ? a.ld : 1;
  p.b = b.data;
  p.b_k_stride = b.transposed ? 1 : b.ld;
  p.b_n_stride = b.transposed ? b.ld : 1;
  p.c = c.data, p.c_m_stride = c.ld, p.c_n_stride = 1;
  p.alpha = alpha, p.accumulate = accumulate;
  matmul(p);
}

}  // namespace laga
