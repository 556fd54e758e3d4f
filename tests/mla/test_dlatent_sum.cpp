// The dtype of the dlatent reduce-scatter's partial sums (RunChoices::dlatent_sum,
// docs/numerics.md): under fp32 storage the option changes nothing, bit for bit; at P = 1 every
// exact form stays bit-identical to explicit under both settings; under bf16, fp32 partials bring
// the forms that gather the latent to explicit's dlatent up to fp32 summation order (one rounding,
// after the sum over ranks, as explicit rounds once after its sum over all heads), while bf16
// partials add one rounding per rank; and the ledger carries the reduce-scatter in fp32, twice the
// bytes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "laga/driver/plan.hpp"
#include "laga/driver/run.hpp"
#include "laga/mla/form.hpp"
#include "verify/compare.hpp"
#include "verify/forms.hpp"

using namespace laga;

namespace {

using verify::run_tensors;

// The forms whose backward reduce-scatters dlatent: those whose plan at P 2 records it.
std::vector<std::string> reducing_forms() {
  std::vector<std::string> out;
  for (const Form* f : registered_forms()) {
    MlaConfig c = MlaConfig::preset("tiny");
    c.form = std::string(f->name()), c.seq_len = 16, c.sp = 2;
    for (const CollectiveRecord& r : plan_comm(Config(c)).attention)
      if (r.op == CollectiveOp::reduce_scatter && r.tensor == "dlatent") {
        out.emplace_back(f->name());
        break;
      }
  }
  return out;
}

MlaConfig tiny(const std::string& form, DType dt, Kernel kernel, int64_t T, int64_t P,
               DlatentSum sum) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.form = form, c.dtype = dt, c.kernel = kernel, c.seq_len = T, c.sp = P, c.num_layers = 2,
  c.batch = 2;
  c.dlatent_sum = sum;
  return c;
}

// Over tensors: the largest relative L2 difference ‖a − b‖ / ‖b‖ and where, and the largest max|a −
// b| / max|b|.
struct Worst {
  double rel_l2 = 0, rel_max = 0;
  std::string at;
};
Worst worst_relative(const verify::Tensors& a, const verify::Tensors& b) {
  Worst w;
  for (const auto& [name, e] : verify::errors(a, b)) {
    if (e.rel_l2 > w.rel_l2) w.rel_l2 = e.rel_l2, w.at = name;
    w.rel_max = std::max(w.rel_max, e.scale > 0 ? e.max_abs / e.scale : e.max_abs);
  }
  return w;
}

}  // namespace

TEST(DlatentSum, ReducingFormsAreTheOnesThatGatherTheLatent) {
  const std::vector<std::string> forms = reducing_forms();
  for (const char* f : {"laga", "laga-recompute", "absorbed-expanded", "absorbed-shared"})
    EXPECT_NE(std::find(forms.begin(), forms.end(), f), forms.end()) << f;
  EXPECT_EQ(std::find(forms.begin(), forms.end(), "explicit"), forms.end());
}

TEST(DlatentSum, UnderFp32StorageTheOptionChangesNoBit) {
  for (const std::string& form : reducing_forms())
    for (Kernel kernel : {Kernel::fused, Kernel::eager})
      for (int64_t P : {2, 4}) {
        const verify::Tensors a =
            run_tensors(tiny(form, DType::f32, kernel, 24, P, DlatentSum::fp32));
        const verify::Tensors b =
            run_tensors(tiny(form, DType::f32, kernel, 24, P, DlatentSum::storage));
        std::string where;
        EXPECT_TRUE(verify::bitwise_equal(a, b, &where))
            << form << " " << kernel_name(kernel) << " P" << P << ": " << where;
      }
}

TEST(DlatentSum, ExactFormsStayBitIdenticalToExplicitAtOneRankUnderBothSettings) {
  for (DlatentSum sum : {DlatentSum::fp32, DlatentSum::storage})
    for (Kernel kernel : {Kernel::fused, Kernel::eager}) {
      const verify::Tensors want = run_tensors(tiny("explicit", DType::bf16, kernel, 40, 1, sum));
      for (const Form* f : registered_forms()) {
        if (!f->exact_at_one_rank()) continue;
        const verify::Tensors got =
            run_tensors(tiny(std::string(f->name()), DType::bf16, kernel, 40, 1, sum));
        std::string where;
        EXPECT_TRUE(verify::bitwise_equal(got, want, &where))
            << f->name() << " " << kernel_name(kernel) << " dlatent sum " << dlatent_sum_name(sum)
            << ": " << where;
      }
    }
}

// In bf16, laga with fp32 partials differs from explicit only by the order of fp32 sums before one
// rounding: an element of dlatent differs by one ulp only where that order moves the fp32 sum
// across a rounding boundary, so in one layer every tensor's relative L2 difference from explicit
// stays within 1e-3 of explicit, while bf16 partials (one more rounding of every element on every
// rank) miss it. Over two layers those few flips reach the first layer's backward through its dy
// and spread (small, L 2, P 8: 2.4e-3 against 6.1e-3 for bf16 partials), so there only "closer than
// bf16 partials" is claimed. The max-abs difference is printed too but cannot be held to 1e-3 in
// bf16: one flipped last bit of the largest element is already 2⁻⁸ of the scale.
TEST(DlatentSum, Fp32PartialsKeepLagaWithinOneThousandthOfExplicitInBf16) {
  struct Point {
    const char* model;
    int64_t T, P, L;
    Kernel kernel;
  };
  const Point points[] = {{"tiny", 64, 4, 2, Kernel::fused},
                          {"tiny", 40, 8, 1, Kernel::eager},
                          {"small", 128, 2, 1, Kernel::fused},
                          {"small", 96, 8, 2, Kernel::eager}};
  for (const Point& pt : points) {
    MlaConfig c = MlaConfig::preset(pt.model);
    c.dtype = DType::bf16, c.kernel = pt.kernel, c.seq_len = pt.T, c.sp = pt.P, c.num_layers = pt.L;
    c.form = "explicit";
    const verify::Tensors want = run_tensors(c);
    for (const char* form : {"laga", "laga-recompute"}) {
      c.form = form;
      c.dlatent_sum = DlatentSum::fp32;
      const Worst f = worst_relative(run_tensors(c), want);
      c.dlatent_sum = DlatentSum::storage;
      const Worst s = worst_relative(run_tensors(c), want);
      const std::string name = fmt::format("{} T{} P{} L{} {} {}", pt.model, pt.T, pt.P, pt.L,
                                           kernel_name(pt.kernel), form);
      fmt::print(
          "[measured] {} vs explicit, worst rel L2 (max-abs/scale): fp32 partials {:.2e} at {} "
          "({:.2e}), "
          "bf16 partials {:.2e} at {} ({:.2e})\n",
          name, f.rel_l2, f.at, f.rel_max, s.rel_l2, s.at, s.rel_max);
      EXPECT_LT(f.rel_l2, s.rel_l2) << name << " at " << f.at;
      if (pt.L == 1) {
        EXPECT_LE(f.rel_l2, 1e-3) << name << " at " << f.at;
      }
    }
  }
}

TEST(DlatentSum, TheLedgerCarriesTheReduceScatterInFp32AtTwiceTheBytes) {
  MlaConfig c = MlaConfig::preset("small");
  c.seq_len = 256, c.sp = 4, c.dtype = DType::bf16, c.form = "laga";
  auto dlatent_record = [&](DlatentSum sum) {
    c.dlatent_sum = sum;
    for (const CollectiveRecord& r : plan_comm(c).attention)
      if (r.tensor == "dlatent") return r;
    ADD_FAILURE() << "no dlatent record";
    return CollectiveRecord{};
  };
  const CollectiveRecord f = dlatent_record(DlatentSum::fp32),
                         s = dlatent_record(DlatentSum::storage);
  EXPECT_EQ(f.dtype, DType::f32);
  EXPECT_EQ(s.dtype, DType::bf16);
  const int64_t shard = c.seq_len / c.sp * c.batch * c.latent_dim();  // this rank's dlatent rows
  EXPECT_EQ(s.tensor_bytes, shard * 2);
  EXPECT_EQ(f.tensor_bytes, shard * 4);
  EXPECT_EQ(f.wire_bytes, 2 * s.wire_bytes);
}
