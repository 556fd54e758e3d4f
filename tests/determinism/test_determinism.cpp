// Determinism (the reliability bar: never a silent wrong number): the same run twice gives bitwise
// the same tensors — inputs, weights, outputs and every gradient — for every form (explicit, laga,
// absorbed with shared and with expanded K/V), kernel (fused, eager), dtype (fp32, bf16) and P (1,
// 2, 4), ranks as threads — every registered form. Each rank of the second run is compared with the
// same rank of the first.
//
// Not here: agreement between ranks, which holds by construction for what a run gathers (every rank
// receives the same all_gather and all_reduce results: tests/comm/test_comm_collectives.cpp); the
// MPI backend, checked the same way on `laga run --dump` under mpirun by
// tests/cli/determinism_mpi.sh; agreement between forms (tests/mla/test_forms.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "laga/driver/run.hpp"
#include "laga/mla/form.hpp"

using namespace laga;

namespace {

struct Case {
  std::string form;  // a registered label
  Kernel kernel;
  DType dtype;
  int64_t sp;
};

std::string case_name(const Case& c) {
  std::string form = c.form;
  std::replace(form.begin(), form.end(), '-', '_');
  return form + "_" + std::string(kernel_name(c.kernel)) + "_" + std::string(dtype_name(c.dtype)) +
         "_sp" + std::to_string(c.sp);
}

MlaConfig config(const Case& k) {
  MlaConfig c = MlaConfig::preset("tiny");
  c.form = k.form, c.kernel = k.kernel, c.dtype = k.dtype, c.sp = k.sp;
  c.seq_len = 48, c.batch = 2, c.num_layers = 2;  // several attention tiles per rank at every P
  return c;
}

// Every gathered tensor of a rank, by name, as raw bytes.
std::vector<std::pair<std::string, std::string>> tensors_of(const RankResult& r) {
  std::vector<std::pair<std::string, std::string>> out;
  auto add = [&](const std::string& name, const Tensor& t) {
    out.emplace_back(name, std::string(static_cast<const char*>(t.raw()), size_t(t.nbytes())));
  };
  add("x", r.x), add("dy", r.dy), add("y", r.y), add("dx", r.dx);
  r.weights.for_each([&](const std::string& name, const Tensor& t) { add(name, t); });
  r.grads.for_each([&](const std::string& name, const Tensor& t) { add(name + ".grad", t); });
  return out;
}

// The names of the tensors that differ between two runs (empty when bitwise equal).
std::vector<std::string> differing(const std::vector<std::pair<std::string, std::string>>& a,
                                   const std::vector<std::pair<std::string, std::string>>& b) {
  std::vector<std::string> names;
  if (a.size() != b.size()) return {"<different tensor lists>"};
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].first != b[i].first || a[i].second != b[i].second) names.push_back(a[i].first);
  return names;
}

class Determinism : public ::testing::TestWithParam<Case> {};

TEST_P(Determinism, SameRunTwiceIsBitwiseIdenticalOnEveryRank) {
  const MlaConfig c = config(GetParam());
  RunOptions opt;
  opt.gather_tensors = true;
  const std::vector<RankResult> first = run_group(c, opt), second = run_group(c, opt);
  ASSERT_EQ(first.size(), size_t(c.sp));
  ASSERT_EQ(second.size(), size_t(c.sp));
  for (int64_t r = 0; r < c.sp; ++r) {
    const auto reference = tensors_of(first[size_t(r)]);
    EXPECT_GT(reference.size(), 4u);
    EXPECT_EQ(differing(tensors_of(second[size_t(r)]), reference), std::vector<std::string>{})
        << "rank " << r << " of the second run differs from rank " << r << " of the first";
  }
}

std::vector<Case> every_case() {
  std::vector<Case> cases;
  for (const Form* form : registered_forms())
    for (Kernel kernel : {Kernel::fused, Kernel::eager})
      for (DType dtype : {DType::f32, DType::bf16})
        for (int64_t sp : {1, 2, 4})
          cases.push_back({std::string(form->name()), kernel, dtype, sp});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(EveryFormKernelDtypeAndP, Determinism, ::testing::ValuesIn(every_case()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return case_name(info.param);
                         });

}  // namespace
