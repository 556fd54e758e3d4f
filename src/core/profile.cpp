#include "laga/core/profile.hpp"

#include "laga/core/error.hpp"

namespace laga {

namespace {
thread_local OpProfile* current = nullptr;
thread_local int depth = 0;  // timed ops open on this thread
}  // namespace

const char* profiled_op_name(ProfiledOp op) {
  switch (op) {
    case ProfiledOp::matmul:
      return "matmul";
    case ProfiledOp::attention_forward:
      return "attention_fwd";
    case ProfiledOp::attention_backward:
      return "attention_bwd";
  }
  return "?";
}

double OpProfile::seconds() const {
  double s = 0;
  for (const auto& [op, t] : by_op) s += t.seconds;
  return s;
}

void OpProfile::add(const OpProfile& o) {
  auto add_to = [](OpTotals& a, const OpTotals& b) {
    a.seconds += b.seconds, a.flops += b.flops, a.calls += b.calls;
  };
  for (const auto& [op, t] : o.by_op) add_to(by_op[op], t);
  for (const auto& [k, t] : o.matmul_shapes) add_to(matmul_shapes[k], t);
}

nlohmann::json OpProfile::to_json() const {
  auto one = [](const OpTotals& t) {
    return nlohmann::json{{"seconds", t.seconds}, {"flops", t.flops}, {"calls", t.calls}};
  };
  nlohmann::json j = nlohmann::json::object();
  for (ProfiledOp op : kProfiledOps)
    j[profiled_op_name(op)] = one(by_op.count(op) ? by_op.at(op) : OpTotals{});
  nlohmann::json shapes = nlohmann::json::object();
  for (const auto& [k, t] : matmul_shapes) shapes[k] = one(t);
  j["matmul_shapes"] = shapes;
  return j;
}

OpProfile OpProfile::from_json(const nlohmann::json& j) {
  auto one = [](const nlohmann::json& v, const std::string& where) {
    LAGA_CHECK(v.is_object() && v.contains("seconds") && v.contains("flops") &&
                   v.contains("calls") && v["seconds"].is_number() && v["flops"].is_number() &&
                   v["calls"].is_number_integer(),
               "profile entry '{}' needs numbers seconds, flops and an integer calls; got {}",
               where, v.dump());
    return OpTotals{v["seconds"].get<double>(), v["flops"].get<double>(),
                    v["calls"].get<int64_t>()};
  };
  LAGA_CHECK(j.is_object(), "a profile is a JSON object; got {}", j.dump());
  OpProfile p;
  for (ProfiledOp op : kProfiledOps)
    if (j.contains(profiled_op_name(op)))
      p.by_op[op] = one(j[profiled_op_name(op)], profiled_op_name(op));
  if (j.contains("matmul_shapes"))
    for (const auto& [k, v] : j["matmul_shapes"].items())
      p.matmul_shapes[k] = one(v, "matmul_shapes." + k);
  return p;
}

ProfileScope::ProfileScope(OpProfile& p) : prev_(current) { current = &p; }
ProfileScope::~ProfileScope() { current = prev_; }

OpTimer::OpTimer(ProfiledOp op, double flops) {
  if (!current) return;
  if (depth++ == 0)
    target_ = current, op_ = op, flops_ = flops, t0_ = std::chrono::steady_clock::now();
  counted_ = true;
}

OpTimer::~OpTimer() {
  if (!counted_) return;
  --depth;
  if (!target_) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  for (OpTotals* t :
       {&target_->by_op[op_], shape_.empty() ? nullptr : &target_->matmul_shapes[shape_]})
    if (t) t->seconds += s, t->flops += flops_, t->calls += 1;
}

}  // namespace laga
