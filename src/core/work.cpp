#include "laga/core/work.hpp"

#include <fmt/format.h>

#include "laga/core/memory.hpp"

namespace laga {

namespace {
thread_local WorkLedger* current = nullptr;
thread_local int depth = 0;  // recorded ops open on this thread
}  // namespace

const char* work_class_name(WorkClass k) {
  switch (k) {
    case WorkClass::matmul:
      return "matmul";
    case WorkClass::attention_forward:
      return "attention_fwd";
    case WorkClass::attention_backward:
      return "attention_bwd";
    case WorkClass::elementwise:
      return "elementwise";
    case WorkClass::accumulate:
      return "accumulate";
  }
  return "?";
}

namespace {
void add_to(ClassTotals& t, const WorkRecord& r) {
  t.seconds += r.seconds, t.flops += r.flops, t.bytes += r.bytes, t.calls += 1;
}
}  // namespace

std::map<WorkClass, ClassTotals> WorkLedger::totals() const {
  std::map<WorkClass, ClassTotals> m;
  for (WorkClass k : kWorkClasses) m[k] = {};
  for (const WorkRecord& r : records) add_to(m[r.cls], r);
  return m;
}

double WorkLedger::flops(bool backward) const {
  double f = 0;
  for (size_t i = backward ? backward_records : 0;
       i < (backward ? records.size() : backward_records); ++i)
    f += records[i].flops;
  return f;
}

double WorkLedger::seconds() const {
  double s = 0;
  for (const WorkRecord& r : records) s += r.seconds;
  return s;
}

std::map<std::string, ClassTotals> WorkLedger::matmul_shapes() const {
  std::map<std::string, ClassTotals> m;
  for (const WorkRecord& r : records)
    if (r.cls == WorkClass::matmul) {
      const int64_t* d = r.dims;
      add_to(m[d[0] > 1 ? fmt::format("{}×{}×{}×{} {}", d[0], d[1], d[2], d[3], dtype_name(r.dtype))
                        : fmt::format("{}×{}×{} {}", d[1], d[2], d[3], dtype_name(r.dtype))],
             r);
    }
  return m;
}

nlohmann::json WorkLedger::to_json() const {
  auto one = [](const ClassTotals& t) {
    return nlohmann::json{
        {"seconds", t.seconds}, {"flops", t.flops}, {"bytes", t.bytes}, {"calls", t.calls}};
  };
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, t] : totals()) j[work_class_name(k)] = one(t);
  nlohmann::json shapes = nlohmann::json::object();
  for (const auto& [k, t] : matmul_shapes()) shapes[k] = one(t);
  j["matmul_shapes"] = shapes;
  return j;
}

WorkScope::WorkScope(WorkLedger& l) : prev_(current) { current = &l; }
WorkScope::~WorkScope() { current = prev_; }

WorkOp::WorkOp(const WorkRecord& r) {
  if (!current) return;
  if (depth++ == 0) {
    target_ = current;
    index_ = target_->records.size();
    target_->records.push_back(r);
    target_->timeline.push_back({TimelineEvent::Kind::compute, int64_t(index_)});
    if (!meta_mode()) t0_ = std::chrono::steady_clock::now();
  }
  counted_ = true;
}

WorkOp::~WorkOp() {
  if (!counted_) return;
  --depth;
  if (!target_ || meta_mode()) return;
  target_->records[index_].seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void note_collective_issue(int64_t index) {
  if (current) current->timeline.push_back({TimelineEvent::Kind::issue, index});
}

void note_collective_wait(int64_t index) {
  if (current) current->timeline.push_back({TimelineEvent::Kind::wait, index});
}

}  // namespace laga
