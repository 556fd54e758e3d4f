// matmul (ops/matmul.hpp) on oneDNN. Two rules make a product's bits a function of its shape,
// strides and dtypes alone, on every ISA:
// - Fixed tiles. C is cut into tiles of kTileRows × kTileCols (a batch entry at a time), and each
//   tile is one single-threaded oneDNN product over the whole K; outside a parallel region the
//   tiles are shared among the thread's team. oneDNN's own threading may split K among threads by
//   the thread count (its AVX2 gemm does), which would make the bits depend on the cores a rank
//   has; the tiles never depend on it.
// - bf16 without a bf16 matmul (core/isa.hpp) runs on dense fp32 copies of A and B (C's too when C
//   is bf16: widened when accumulating, rounded back once after the product): oneDNN's bf16
//   semantics.
#include "laga/ops/matmul.hpp"

#include <omp.h>

#include <algorithm>
#include <dnnl.hpp>
#include <string>
#include <unordered_map>

#include "laga/core/error.hpp"
#include "laga/core/isa.hpp"
#include "laga/core/memory.hpp"
#include "laga/core/work.hpp"
#include "laga/core/progress.hpp"
#include "src/ops/rows.hpp"

namespace laga {

namespace {

// Constants, never a function of the thread count: a product's bits depend on the tiles (above).
// A tile is one single-threaded oneDNN product, so it must be large enough for that product to run
// near oneDNN's single-threaded peak; the rate a build reaches is what bench_block's and
// bench_attention's matmul baseline (bench/matmul_bench.hpp) reports.
constexpr int64_t kTileRows = 512, kTileCols = 1024;

dnnl::engine& engine() {
  static dnnl::engine e = (apply_isa_cap(), dnnl::engine(dnnl::engine::kind::cpu, 0));
  return e;
}

dnnl::memory::data_type dnnl_type(DType t) {
  return t == DType::f32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
}

// oneDNN's scratchpad (scratchpad_mode::user) and the widened path's fp32 copies, managed here: one
// block per thread and role, grown as needed, taken from the caching allocator (reserved bytes,
// never a tracker's) and given back when the thread ends. A rank's thread lives for one run; with
// the library's own per-thread scratchpad every run paid the first touch of fresh pages again. The
// next run's thread gets the same pages back from the cache.
class Scratch {
 public:
  ~Scratch() {
    if (p_) pool_release(p_, n_);
  }
  void* get(size_t bytes) {
    if (bytes <= n_) return p_;
    if (p_) pool_release(p_, n_);
    p_ = pool_allocate(bytes), n_ = bytes;
    LAGA_CHECK(p_, "out of memory: {} bytes of matmul scratch", bytes);
    return p_;
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

struct Cached {
  dnnl::matmul prim;
  dnnl::memory a, b, c, scratch;
  size_t scratch_bytes = 0;
};

std::string key_of(const MatmulParams& p) {
  return fmt::format("{},{},{},{},{},{}|{},{},{}|{},{},{}|{},{},{}|{},{}", p.batch, p.M, p.N, p.K,
                     int(p.ab_dtype), int(p.c_dtype), p.a_batch_stride, p.a_m_stride, p.a_k_stride,
                     p.b_batch_stride, p.b_k_stride, p.b_n_stride, p.c_batch_stride, p.c_m_stride,
                     p.c_n_stride, p.alpha, p.accumulate);
}

Cached make(const MatmulParams& p) {
  using dims = dnnl::memory::dims;
  auto md = [&](int64_t d0, int64_t d1, int64_t s_b, int64_t s0, int64_t s1, DType t) {
    return dnnl::memory::desc(dims{p.batch, d0, d1}, dnnl_type(t),
                              dims{p.batch > 1 ? s_b : d0 * d1, s0, s1});
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
    LAGA_ASSERT(false, "oneDNN has no matmul for batch {} M {} N {} K {} ({} -> {}): {}", p.batch,
                p.M, p.N, p.K, dtype_name(p.ab_dtype), dtype_name(p.c_dtype), e.what());
  }
  return Cached{dnnl::matmul(pd),
                dnnl::memory(a_md, engine(), DNNL_MEMORY_NONE),
                dnnl::memory(b_md, engine(), DNNL_MEMORY_NONE),
                dnnl::memory(c_md, engine(), DNNL_MEMORY_NONE),
                dnnl::memory(pd.scratchpad_desc(), engine(), DNNL_MEMORY_NONE),
                pd.scratchpad_desc().get_size()};
}

// One product on the calling thread alone: oneDNN plans and runs it for one thread (its thread
// count is the calling thread's OpenMP one), so neither the rank's cores nor an enclosing parallel
// region can change how it splits the work.
class SingleThreaded {
 public:
  SingleThreaded() : saved_(omp_get_max_threads()) {
    if (saved_ != 1) omp_set_num_threads(1);
  }
  ~SingleThreaded() {
    if (saved_ != 1) omp_set_num_threads(saved_);
  }

 private:
  int saved_;
};

void run_one(const MatmulParams& p) {
  const SingleThreaded one;
  thread_local std::unordered_map<std::string, Cached> cache;
  thread_local dnnl::stream stream(engine());
  const std::string key = key_of(p);
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() > 4096) cache.clear();
    it = cache.emplace(key, make(p)).first;
  }
  Cached& c = it->second;
  c.a.set_data_handle(const_cast<void*>(p.a));
  c.b.set_data_handle(const_cast<void*>(p.b));
  c.c.set_data_handle(p.c);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, c.a}, {DNNL_ARG_WEIGHTS, c.b}, {DNNL_ARG_DST, c.c}};
  if (c.scratch_bytes) {
    thread_local Scratch scratch;
    c.scratch.set_data_handle(scratch.get(c.scratch_bytes));
    args.emplace(DNNL_ARG_SCRATCHPAD, c.scratch);
  }
  c.prim.execute(stream, args);
  stream.wait();
}

// The product as fixed tiles of C, each over the whole K, on the thread's team outside a parallel
// region and on the calling thread inside one.
void run_tiles(const MatmulParams& p) {
  const int64_t row_tiles = (p.M + kTileRows - 1) / kTileRows,
                col_tiles = (p.N + kTileCols - 1) / kTileCols;
  const int64_t tiles = p.batch * row_tiles * col_tiles;
  const int64_t a_size = dtype_size(p.ab_dtype), c_size = dtype_size(p.c_dtype);
  auto tile = [&](int64_t i) {
    const int64_t b = i / (row_tiles * col_tiles), m0 = (i / col_tiles) % row_tiles * kTileRows,
                  n0 = i % col_tiles * kTileCols;
    MatmulParams t = p;
    t.batch = 1, t.M = std::min(kTileRows, p.M - m0), t.N = std::min(kTileCols, p.N - n0);
    t.a = static_cast<const char*>(p.a) + (b * p.a_batch_stride + m0 * p.a_m_stride) * a_size;
    t.b = static_cast<const char*>(p.b) + (b * p.b_batch_stride + n0 * p.b_n_stride) * a_size;
    t.c = static_cast<char*>(p.c) +
          (b * p.c_batch_stride + m0 * p.c_m_stride + n0 * p.c_n_stride) * c_size;
    t.a_batch_stride = t.b_batch_stride = t.c_batch_stride = 0;
    run_one(t);
  };
  if (tiles == 1 || omp_in_parallel()) {
    for (int64_t i = 0; i < tiles; ++i) tile(i);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t i = 0; i < tiles; ++i) tile(i);
}

// An operand [batch, rows, cols] at element strides, and the layout of its dense fp32 copy: the
// copy keeps the operand's orientation (rows contiguous where its columns are, columns where its
// rows are), so a transposed view converts line by line of its storage.
struct Operand {
  int64_t batch = 1, rows = 0, cols = 0, s_batch = 0, s_row = 0, s_col = 1;
  bool col_major() const { return s_col != 1 && s_row == 1; }
  int64_t wide_row_stride() const { return col_major() ? 1 : cols; }
  int64_t wide_col_stride() const { return col_major() ? rows : 1; }
  int64_t elements() const { return batch * rows * cols; }
};

// wide (dense, o's wide strides) = the bf16 operand widened; or, when narrow, the bf16 operand =
// wide rounded. On the calling thread inside a parallel region, on the thread's team outside one.
void convert(const Operand& o, const bf16* bf16_data, float* wide, bool narrow) {
  const bool cm = o.col_major();
  const int64_t outer = cm ? o.cols : o.rows, inner = cm ? o.rows : o.cols;
  const int64_t s_outer = cm ? o.s_col : o.s_row, s_inner = cm ? o.s_row : o.s_col;
  const rows::Kernels& k = rows::kernels();
  auto* base = const_cast<bf16*>(bf16_data);
  const int64_t lines = o.batch * outer;
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && \
                                              o.elements() >= (int64_t(1) << 16))
  for (int64_t line = 0; line < lines; ++line) {
    bf16* s = base + line / outer * o.s_batch + line % outer * s_outer;
    float* w = wide + line * inner;
    if (s_inner == 1) {
      if (narrow)
        k.narrow(w, s, inner);
      else
        k.widen(s, w, inner);
      continue;
    }
    for (int64_t j = 0; j < inner; ++j) {
      if (narrow)
        s[j * s_inner] = to_bf16(w[j]);
      else
        w[j] = to_float(s[j * s_inner]);
    }
  }
}

// p with bf16 operands run in fp32 on widened copies (C's too when C is bf16).
void run_widened(const MatmulParams& p) {
  const Operand oa{p.batch, p.M, p.K, p.a_batch_stride, p.a_m_stride, p.a_k_stride};
  const Operand ob{p.batch, p.K, p.N, p.b_batch_stride, p.b_k_stride, p.b_n_stride};
  const Operand oc{p.batch, p.M, p.N, p.c_batch_stride, p.c_m_stride, p.c_n_stride};
  thread_local Scratch wide_a, wide_b, wide_c;
  auto* wa = static_cast<float*>(wide_a.get(size_t(oa.elements()) * sizeof(float)));
  auto* wb = static_cast<float*>(wide_b.get(size_t(ob.elements()) * sizeof(float)));
  convert(oa, static_cast<const bf16*>(p.a), wa, false);
  convert(ob, static_cast<const bf16*>(p.b), wb, false);
  MatmulParams f = p;
  f.ab_dtype = DType::f32;
  f.a = wa, f.a_batch_stride = oa.rows * oa.cols, f.a_m_stride = oa.wide_row_stride(),
  f.a_k_stride = oa.wide_col_stride();
  f.b = wb, f.b_batch_stride = ob.rows * ob.cols, f.b_k_stride = ob.wide_row_stride(),
  f.b_n_stride = ob.wide_col_stride();
  if (p.c_dtype == DType::f32) return run_tiles(f);
  auto* wc = static_cast<float*>(wide_c.get(size_t(oc.elements()) * sizeof(float)));
  if (p.accumulate) convert(oc, static_cast<const bf16*>(p.c), wc, false);
  f.c_dtype = DType::f32;
  f.c = wc, f.c_batch_stride = oc.rows * oc.cols, f.c_m_stride = oc.wide_row_stride(),
  f.c_n_stride = oc.wide_col_stride();
  run_tiles(f);
  convert(oc, static_cast<const bf16*>(p.c), wc, true);
}

}  // namespace

void matmul(const MatmulParams& p) {
  if (p.batch == 0 || p.M == 0 || p.N == 0) return;
  if (p.K == 0) {
    LAGA_ASSERT(p.accumulate, "matmul with K = 0 and overwrite is not supported");
    return;
  }
  WorkRecord rec;
  rec.cls = WorkClass::matmul, rec.op = "matmul", rec.dtype = p.ab_dtype;
  rec.flops = 2.0 * double(p.batch) * double(p.M) * double(p.N) * double(p.K);
  rec.dims[0] = p.batch, rec.dims[1] = p.M, rec.dims[2] = p.N, rec.dims[3] = p.K;
  WorkOp work(rec);
  if (meta_mode()) return;
  if (p.ab_dtype == DType::bf16 && !bf16_matmul_native())
    run_widened(p);
  else
    run_tiles(p);
  progress_point();
}

MatView MatView::t() const {
  MatView v = *this;
  v.transposed = !transposed;
  return v;
}

MatView MatView::col_slice(int64_t begin, int64_t end) const {
  LAGA_ASSERT(!transposed && 0 <= begin && begin <= end && end <= cols,
              "column slice [{}, {}) of a {}-column view", begin, end, cols);
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
