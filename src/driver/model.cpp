// The performance model (driver/model.hpp; equations and assumptions in docs/model.md).
#include "laga/driver/model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include "laga/core/error.hpp"
#include "laga/driver/plan.hpp"
#include "laga/mla/form.hpp"

namespace laga {

namespace {

using json = nlohmann::json;

std::optional<CollectiveOp> parse_op(std::string_view s) {
  for (CollectiveOp op : kModelledOps)
    if (collective_name(op) == s) return op;
  return std::nullopt;
}

std::string op_list() {
  std::string s;
  for (CollectiveOp op : kModelledOps)
    s += (s.empty() ? "" : ", ") + std::string(collective_name(op));
  return s;
}

// Reading a hardware file: every error names the file and the field's full path.
struct Reader {
  const std::string& path;

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    LAGA_FAIL_USAGE("hardware file {}: field '{}' {}", path, field, what);
  }
  const json& child(const json& obj, const std::string& prefix, const char* key,
                    const char* expected) const {
    const std::string field = prefix.empty() ? key : prefix + "." + key;
    if (!obj.contains(key)) fail(field, fmt::format("is missing; give {}", expected));
    return obj.at(key);
  }
  double positive(const json& v, const std::string& field, const char* unit) const {
    if (!v.is_number())
      fail(field,
           fmt::format("is {} ({}), not a positive number ({})", v.type_name(), v.dump(), unit));
    const double x = v.get<double>();
    if (!(x > 0) || !std::isfinite(x))
      fail(field, fmt::format("= {} must be a positive number ({})", v.dump(), unit));
    return x;
  }
  // A rate: one positive number for every T, or {"T": positive number, ...} measured at those T.
  SeqRate rate(const json& v, const std::string& field, const char* unit) const {
    if (!v.is_object()) return SeqRate::constant(positive(v, field, unit));
    if (v.empty())
      fail(field,
           fmt::format("is an empty object; give a positive number ({}) or {{\"T\": rate, ...}}",
                       unit));
    SeqRate r;
    for (const auto& [k, x] : v.items()) {
      if (k == "notes" || k == "source") continue;
      int64_t T = 0;
      const bool digits =
          !k.empty() && k.size() < 10 &&
          std::all_of(k.begin(), k.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
      if (digits) T = std::stoll(k);
      if (T < 1)
        fail(field + "." + k,
             fmt::format("is not a sequence length; the keys of a rate by T are positive integers "
                         "(\"2048\"), each with a positive number ({})",
                         unit));
      r.by_seq[T] = positive(x, field + "." + k, unit);
    }
    if (r.by_seq.empty())
      fail(field, fmt::format("holds no rate; give {{\"T\": rate, ...}} ({})", unit));
    return r;
  }
  double non_negative(const json& v, const std::string& field, const char* unit) const {
    if (!v.is_number())
      fail(field, fmt::format("is {} ({}), not a number ≥ 0 ({})", v.type_name(), v.dump(), unit));
    const double x = v.get<double>();
    if (!(x >= 0) || !std::isfinite(x))
      fail(field, fmt::format("= {} must be a number ≥ 0 ({})", v.dump(), unit));
    return x;
  }
  const json& object(const json& v, const std::string& field) const {
    if (!v.is_object()) fail(field, fmt::format("is {}, not an object", v.type_name()));
    return v;
  }
  std::string string(const json& obj, const std::string& prefix, const char* key) const {
    const json& v = child(obj, prefix, key, "a string");
    if (!v.is_string())
      fail(prefix.empty() ? key : prefix + "." + key,
           fmt::format("is {}, not a string", v.type_name()));
    return v.get<std::string>();
  }
  void only(const json& obj, const std::string& prefix, const std::set<std::string>& known) const {
    for (const auto& [k, v] : obj.items())
      if (!known.count(k) && k != "notes" && k != "source") {
        std::string valid;
        for (const auto& n : known) valid += (valid.empty() ? "" : ", ") + n;
        fail(prefix.empty() ? k : prefix + "." + k,
             fmt::format("is not a known field; valid here: {}, notes, source", valid));
      }
  }
  // A number for every op, or one number for all of them.
  std::map<CollectiveOp, double> per_op(const json& v, const std::string& field, bool positive_only,
                                        const char* unit) const {
    std::map<CollectiveOp, double> m;
    if (v.is_object()) {
      for (const auto& [k, x] : v.items())
        if (!parse_op(k) && k != "notes" && k != "source")
          fail(field + "." + k, fmt::format("is not a collective; valid: {}", op_list()));
      for (CollectiveOp op : kModelledOps) {
        const std::string name(collective_name(op));
        if (!v.contains(name))
          fail(field + "." + name,
               fmt::format("is missing; give a number ({}) for each of {}, or one number for all",
                           unit, op_list()));
        m[op] = positive_only ? positive(v.at(name), field + "." + name, unit)
                              : non_negative(v.at(name), field + "." + name, unit);
      }
    } else {
      const double x = positive_only ? positive(v, field, unit) : non_negative(v, field, unit);
      for (CollectiveOp op : kModelledOps) m[op] = x;
    }
    return m;
  }
  LinkSpec link(const json& obj, const std::string& field) const {
    object(obj, field);
    only(obj, field, {"busbw_GBps", "latency_us", "host_ns_per_byte"});
    LinkSpec l;
    l.busbw_GBps = per_op(child(obj, field, "busbw_GBps", "a number (GB/s) or one per collective"),
                          field + ".busbw_GBps", true, "GB/s");
    const json& lat = child(obj, field, "latency_us", "a number ≥ 0 (µs) or one per collective");
    for (const auto& [op, us] : per_op(lat, field + ".latency_us", false, "µs"))
      l.latency_op_s[op] = us * 1e-6;
    l.latency_s = l.latency_op_s.begin()->second;
    for (const auto& [op, s] : l.latency_op_s) l.latency_s = std::max(l.latency_s, s);
    if (obj.contains("host_ns_per_byte"))
      for (const auto& [op, ns] : per_op(obj.at("host_ns_per_byte"), field + ".host_ns_per_byte",
                                         false, "ns per byte sent"))
        l.host_ns_per_byte[op] = ns;
    return l;
  }
};

const char* kAttentionKeys[] = {"attention_fwd_tflops",
                                "attention_bwd_tflops",
                                "eager_attention_fwd_tflops",
                                "eager_attention_bwd_tflops",
                                "latent_attention_fwd_tflops",
                                "latent_attention_bwd_tflops",
                                "eager_latent_attention_fwd_tflops",
                                "eager_latent_attention_bwd_tflops",
                                "mqa_attention_fwd_tflops",
                                "mqa_attention_bwd_tflops",
                                "eager_mqa_attention_fwd_tflops",
                                "eager_mqa_attention_bwd_tflops",
                                "laga_fused_attention_fwd_tflops",
                                "laga_fused_attention_bwd_tflops",
                                "sparse_attention_fwd_tflops",
                                "sparse_attention_bwd_tflops",
                                "indexer_attention_fwd_tflops",
                                "indexer_attention_bwd_tflops"};

json link_json(const LinkSpec& l) {
  json bw, lat;
  for (const auto& [op, v] : l.busbw_GBps) bw[std::string(collective_name(op))] = v;
  for (CollectiveOp op : kModelledOps) lat[std::string(collective_name(op))] = l.latency(op) * 1e6;
  json j = {{"busbw_GBps", bw}, {"latency_us", lat}};
  for (const auto& [op, v] : l.host_ns_per_byte)
    j["host_ns_per_byte"][std::string(collective_name(op))] = v;
  return j;
}

}  // namespace

double bus_factor(CollectiveOp op, int64_t P) {
  const double p = double(P);
  return op == CollectiveOp::all_reduce ? 2 * (p - 1) / p : (p - 1) / p;
}

double nccl_size_bytes(CollectiveOp op, int64_t P, double tensor_bytes) {
  // The ledger's tensor bytes are the shard for all_gather and reduce_scatter
  // (comm/communicator.hpp).
  return op == CollectiveOp::all_gather || op == CollectiveOp::reduce_scatter
             ? double(P) * tensor_bytes
             : tensor_bytes;
}

double LinkSpec::latency(CollectiveOp op) const {
  auto it = latency_op_s.find(op);
  return it != latency_op_s.end() ? it->second : latency_s;
}

double LinkSpec::host_cost(CollectiveOp op) const {
  auto it = host_ns_per_byte.find(op);
  return it != host_ns_per_byte.end() ? it->second * 1e-9 : 0.0;
}

double SeqRate::at(int64_t T) const {
  LAGA_ASSERT(!by_seq.empty(), "a rate with no value");
  auto hi = by_seq.lower_bound(T);
  if (hi == by_seq.end()) return std::prev(hi)->second;  // beyond the longest T measured: held
  // measured here, or below the shortest: held
  if (hi->first == T || hi == by_seq.begin()) return hi->second;
  auto lo = std::prev(hi);
  const double f =
      std::log(double(T) / double(lo->first)) / std::log(double(hi->first) / double(lo->first));
  return lo->second + f * (hi->second - lo->second);
}

json SeqRate::to_json() const {
  if (by_seq.size() == 1 && by_seq.begin()->first == 0) return by_seq.begin()->second;
  json j = json::object();
  for (const auto& [T, r] : by_seq) j[std::to_string(T)] = r;
  return j;
}

double ComputeSpec::attention_rate(Kernel kernel, AttentionShape shape, bool backward,
                                   int64_t T) const {
  const std::string dir = backward ? "bwd" : "fwd";
  const std::string eager = kernel == Kernel::eager ? "eager_" : "";
  const std::string sh =
      shape == AttentionShape::dense ? "" : std::string(attention_shape_name(shape)) + "_";
  std::vector<std::string> keys = {eager + sh + "attention_" + dir + "_tflops"};
  // the sparse kernel's heads share one latent head: without a rate of its own, the MQA one
  if (shape == AttentionShape::sparse) keys.push_back(eager + "mqa_attention_" + dir + "_tflops");
  keys.push_back(eager + "attention_" + dir + "_tflops");
  keys.push_back("attention_" + dir + "_tflops");
  for (const std::string& key : keys)
    if (auto it = attention_tflops.find(key); it != attention_tflops.end()) return it->second.at(T);
  LAGA_ASSERT(false, "no attention rate {} (the required keys were checked on reading)", dir);
}

HardwareSpec HardwareSpec::from_json(const json& j, const std::string& path) {
  const Reader r{path};
  if (!j.is_object())
    LAGA_FAIL_USAGE("hardware file {}: must be a JSON object, got {}", path, j.type_name());
  r.only(j, "", {"name", "compute", "link", "ranks_per_node"});
  HardwareSpec hw;
  hw.path = path;
  hw.name = r.string(j, "", "name");
  hw.source = r.string(j, "", "source");
  if (j.contains("notes")) hw.notes = j.at("notes");
  const json& compute = r.object(
      r.child(j, "", "compute", "an object with a section per dtype (bf16, fp32)"), "compute");
  if (compute.empty()) r.fail("compute", "is empty; give a section per dtype: bf16, fp32");
  for (const auto& [dt_name, sec] : compute.items()) {
    if (dt_name == "notes" || dt_name == "source") continue;
    DType dt;
    if (dt_name == "bf16")
      dt = DType::bf16;
    else if (dt_name == "fp32")
      dt = DType::f32;
    else
      r.fail("compute." + dt_name, "is not a dtype; valid: bf16, fp32");
    const std::string f = "compute." + dt_name;
    r.object(sec, f);
    std::set<std::string> known{"matmul_tflops", "elementwise_GBps", "accumulate_GBps"};
    for (const char* k : kAttentionKeys) known.insert(k);
    r.only(sec, f, known);
    ComputeSpec c;
    c.matmul_tflops = r.rate(r.child(sec, f, "matmul_tflops", "a positive number (TFLOP/s)"),
                             f + ".matmul_tflops", "TFLOP/s");
    c.elementwise_GBps = r.rate(r.child(sec, f, "elementwise_GBps", "a positive number (GB/s)"),
                                f + ".elementwise_GBps", "GB/s");
    if (sec.contains("accumulate_GBps"))
      c.accumulate_GBps = r.rate(sec.at("accumulate_GBps"), f + ".accumulate_GBps", "GB/s");
    for (const char* k : {"attention_fwd_tflops", "attention_bwd_tflops"})
      r.child(sec, f, k, "a positive number (TFLOP/s)");
    for (const char* k : kAttentionKeys)
      if (sec.contains(k)) c.attention_tflops[k] = r.rate(sec.at(k), f + "." + k, "TFLOP/s");
    hw.compute[dt] = c;
  }
  const json& link =
      r.object(r.child(j, "", "link", "an object with intra_node (and inter_node)"), "link");
  r.only(link, "link", {"intra_node", "inter_node"});
  hw.intra_node = r.link(r.child(link, "link", "intra_node", "an object {busbw_GBps, latency_us}"),
                         "link.intra_node");
  if (link.contains("inter_node")) hw.inter_node = r.link(link.at("inter_node"), "link.inter_node");
  const json& rpn = r.child(j, "", "ranks_per_node", "a positive integer");
  if (!rpn.is_number_integer() || rpn.get<int64_t>() < 1)
    r.fail("ranks_per_node", fmt::format("= {} must be a positive integer", rpn.dump()));
  hw.ranks_per_node = rpn.get<int64_t>();
  return hw;
}

HardwareSpec HardwareSpec::load(const std::string& path) {
  std::ifstream in(path);
  LAGA_CHECK(in.good(),
             "hardware file {}: cannot open ({}); give a readable JSON file (docs/model.md §2)",
             path, std::strerror(errno));
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  LAGA_CHECK(!j.is_discarded(), "hardware file {}: not valid JSON", path);
  return from_json(j, path);
}

json HardwareSpec::to_json() const {
  json compute_j;
  for (const auto& [dt, c] : compute) {
    json s = {{"matmul_tflops", c.matmul_tflops.to_json()},
              {"elementwise_GBps", c.elementwise_GBps.to_json()}};
    if (c.accumulate_GBps) s["accumulate_GBps"] = c.accumulate_GBps->to_json();
    for (const auto& [k, v] : c.attention_tflops) s[k] = v.to_json();
    compute_j[dt == DType::bf16 ? "bf16" : "fp32"] = s;
  }
  json link = {{"intra_node", link_json(intra_node)}};
  if (inter_node) link["inter_node"] = link_json(*inter_node);
  json j = {{"name", name},
            {"source", source},
            {"compute", compute_j},
            {"link", link},
            {"ranks_per_node", ranks_per_node}};
  if (!notes.is_null()) j["notes"] = notes;
  return j;
}

const ComputeSpec& HardwareSpec::compute_for(DType d) const {
  auto it = compute.find(d);
  if (it == compute.end())
    LAGA_FAIL_USAGE("hardware file {}: field 'compute.{}' is missing; it is needed for --dtype {}",
                    path, d == DType::bf16 ? "bf16" : "fp32", dtype_name(d));
  return it->second;
}

namespace {

// Where a collective's group sits: its size n, and over the nodes of ranks_per_node R consecutive
// outermost ranks, whether it spans several and the most of its ranks any one node holds (m).
struct GroupPlacement {
  int64_t n = 0, per_node = 0;
  bool crosses = false;
};

GroupPlacement placement(const CollectiveRecord& r, int64_t P, int64_t R) {
  GroupPlacement g;
  g.n = r.group_size(P);
  if (!r.group) {
    g.crosses = P > R, g.per_node = std::min(P, R);
    return g;
  }
  std::map<int64_t, int64_t> count;  // node → ranks of the group on it
  for (int q : *r.group) g.per_node = std::max(g.per_node, ++count[q / R]);
  g.crosses = count.size() > 1;
  return g;
}

}  // namespace

CollectiveTime collective_time(const HardwareSpec& hw, const CollectiveRecord& r, int64_t P) {
  CollectiveTime t;
  t.record = r;
  // A sub-group's collective (laga --ulysses: the head-scatter groups, the rings across them) runs
  // over its own n ranks; it crosses nodes when its ranks sit on several, and there m of them share
  // a node (m NICs carry its crossings at once).
  const GroupPlacement g = placement(r, P, hw.ranks_per_node);
  const int64_t n = g.n;
  auto inter = [&]() -> const LinkSpec& {
    LAGA_CHECK(hw.inter_node.has_value(),
               "hardware file {}: field 'link.inter_node' is missing; it is needed for --sp {} "
               "over ranks_per_node {}",
               hw.path, P, hw.ranks_per_node);
    return *hw.inter_node;
  };
  // Per byte sent; over several nodes, the costlier of the two links' for all the bytes (an upper
  // bound).
  auto host_cost = [&](CollectiveOp op) {
    return g.crosses ? std::max(hw.intra_node.host_cost(op), inter().host_cost(op))
                     : hw.intra_node.host_cost(op);
  };
  if (r.op == CollectiveOp::send_recv) {
    // One hop of a ring: every rank sends its tensor bytes to one neighbour at once, as one step of
    // the all-to-all's pairwise exchange, so at that link's all_to_all rate and latency: latency +
    // bytes / bandwidth per hop. Over several nodes the hop is as slow as its node crossing (one
    // rank's own inter-node bandwidth: only that rank's pair crosses).
    t.size_bytes = double(r.tensor_bytes);
    if (n <= 1) return t;
    const CollectiveOp as = CollectiveOp::all_to_all;
    const LinkSpec& in = hw.intra_node;
    t.busbw_GBps = in.busbw_GBps.at(as), t.latency_s = in.latency(as);
    if (g.crosses) {
      t.crosses_nodes = true;
      t.busbw_GBps = std::min(t.busbw_GBps, inter().busbw_GBps.at(as));
      t.latency_s = std::max(t.latency_s, inter().latency(as));
    }
    t.seconds = t.latency_s + t.size_bytes / (t.busbw_GBps * 1e9);
    t.exposed_s = t.seconds;
    t.host_s = t.size_bytes * host_cost(as);
    return t;
  }
  LAGA_ASSERT(parse_op(collective_name(r.op)), "the model has no rate for {}",
              collective_name(r.op));
  t.size_bytes = nccl_size_bytes(r.op, n, double(r.tensor_bytes));
  if (n <= 1) return t;  // an identity: no traffic, no latency
  const double bus_bytes = t.size_bytes * bus_factor(r.op, n);
  const LinkSpec& in = hw.intra_node;
  if (!g.crosses) {
    t.busbw_GBps = in.busbw_GBps.at(r.op);
    t.latency_s = in.latency(r.op);
    t.seconds = t.latency_s + bus_bytes / (t.busbw_GBps * 1e9);
  } else {
    const LinkSpec& out = inter();
    t.crosses_nodes = true;
    t.latency_s = std::max(in.latency(r.op), out.latency(r.op));
    if (r.op == CollectiveOp::all_to_all) {
      // Pairwise exchange: of the n−1 peers' chunks (S/n each), m−1 stay in the node (at the intra
      // bus bandwidth) and n−m cross it (at the rank's own inter-node bandwidth); both parts at
      // once.
      const double m = double(g.per_node), p = double(n), chunk = t.size_bytes / p;
      const double s = std::max(chunk * (m - 1) / (in.busbw_GBps.at(r.op) * 1e9),
                                chunk * (p - m) / (out.busbw_GBps.at(r.op) * 1e9));
      t.seconds = t.latency_s + s;
      t.busbw_GBps = bus_bytes / s / 1e9;
    } else {
      // A ring over ranks in several nodes runs each step at its slowest hop. NCCL-style rings run
      // one channel per rank's NIC (rail), so the m ranks of the group in a node carry the node
      // crossings of m rings at once: the crossing hop's bus bandwidth is m × a rank's own
      // inter-node bandwidth.
      t.busbw_GBps = std::min(in.busbw_GBps.at(r.op), double(g.per_node) * out.busbw_GBps.at(r.op));
      t.seconds = t.latency_s + bus_bytes / (t.busbw_GBps * 1e9);
    }
  }
  t.exposed_s = t.seconds;  // no overlap: the caller waits for the whole collective
  t.host_s = bus_bytes * host_cost(r.op);
  return t;
}

std::string_view attention_shape_name(AttentionShape s) {
  switch (s) {
    case AttentionShape::dense:
      return "dense";
    case AttentionShape::latent:
      return "latent";
    case AttentionShape::mqa:
      return "mqa";
    case AttentionShape::laga_fused:
      return "laga_fused";
    case AttentionShape::sparse:
      return "sparse";
    case AttentionShape::indexer:
      return "indexer";
  }
  return "?";
}

AttentionShape attention_shape(const WorkRecord& r, const MlaConfig& m) {
  if (r.kernel == AttentionKernel::latent) return AttentionShape::laga_fused;
  if (r.kernel == AttentionKernel::indexer) return AttentionShape::indexer;
  if (r.kernel == AttentionKernel::sparse) return AttentionShape::sparse;
  const int64_t Hq = r.dims[1], Hkv = r.dims[2], Dqk = r.dims[3];
  if (Hkv < Hq) return AttentionShape::mqa;
  if (Dqk == m.latent_dim()) return AttentionShape::latent;
  return AttentionShape::dense;
}

double work_seconds(const WorkRecord& r, const MlaConfig& m, const ComputeSpec& rates) {
  switch (r.cls) {
    case WorkClass::matmul:
      return r.flops / (rates.matmul_tflops.at(m.seq_len) * 1e12);
    case WorkClass::attention_forward:
    case WorkClass::attention_backward: {
      // The latent kernel's tiles are the fused kernel's: without a rate of its own it runs at the
      // fused rate (attention_rate's fallback).
      const Kernel k = r.kernel == AttentionKernel::eager ? Kernel::eager : Kernel::fused;
      // The sparse kernels' calls are row blocks over every key: their rates are keyed by the
      // sequence (calibrate.cpp measures them over T keys), the others' by the call's length.
      const bool sparse =
          r.kernel == AttentionKernel::sparse || r.kernel == AttentionKernel::indexer;
      return r.flops /
             (rates.attention_rate(k, attention_shape(r, m), r.cls == WorkClass::attention_backward,
                                   sparse ? m.seq_len : r.dims[0]) *
              1e12);
    }
    case WorkClass::elementwise:
      return r.bytes / (rates.elementwise_GBps.at(m.seq_len) * 1e9);
    case WorkClass::accumulate:
      return r.bytes / (rates.accumulate_rate(m.seq_len) * 1e9);
  }
  return 0;
}

namespace {

// One rank in the replay: its plan, clock and place in its timeline, and what it has spent.
struct RankReplay {
  std::shared_ptr<const Plan> plan;  // shared by ranks that plan alike
  size_t pos = 0;
  double clock = 0, fwd_end = 0;
  std::vector<double> issued;  // per collective: when this rank issued it (−1: not yet)
  FormPrediction f;
  bool done() const { return pos == plan->work.timeline.size(); }
  bool backward() const { return pos >= plan->work.backward_begins; }
};

}  // namespace

RankPlans plan_ranks(const Config& c) {
  // Where every rank runs the same shapes (Form::ranks_alike: N consecutive tokens of a
  // head-scatter form) its plan is rank 0's (Model.AlikeRanksPlanTheSameWork); otherwise each rank
  // is planned.
  const bool alike = form_of(*c).ranks_alike(*c);
  RankPlans plans;
  for (int64_t r = 0; r < c->sp; ++r)
    plans.push_back(alike && r > 0 ? plans[0] : std::make_shared<const Plan>(plan_run(c, int(r))));
  return plans;
}

FormPrediction predict(const Config& c, const HardwareSpec& hw) {
  return predict(c, hw, plan_ranks(c));
}

FormPrediction predict(const Config& c, const HardwareSpec& hw, const RankPlans& plans) {
  const MlaConfig& m = *c;
  const ComputeSpec& rates = hw.compute_for(m.dtype);
  const int64_t P = m.sp;
  LAGA_ASSERT(int64_t(plans.size()) == P, "{} plans for {} ranks", plans.size(), P);
  std::vector<RankReplay> ranks(static_cast<size_t>(P));
  for (int64_t r = 0; r < P; ++r) {
    RankReplay& x = ranks[size_t(r)];
    x.plan = plans[size_t(r)];
    x.issued.assign(x.plan->comm.attention.size(), -1);
    x.f.form = displayed_form(m), x.f.rank = r;
    for (const CollectiveRecord& rec : x.plan->comm.attention)
      x.f.collectives.push_back(collective_time(hw, rec, P));
    LAGA_ASSERT(x.issued.size() == ranks[0].issued.size(),
                "{}: rank {} planned {} collectives, rank 0 {}", m.form, r, x.issued.size(),
                ranks[0].issued.size());
  }
  const size_t n = ranks[0].issued.size();
  // Collective k of rank r runs with the ranks of its group (every rank issues its collectives in
  // the same order, so their k-th is the same collective), starting when all of them have issued
  // it and each one's link is done with the collectives it started before.
  std::vector<double> end(n * static_cast<size_t>(P), -1.0), link_free(static_cast<size_t>(P), 0.0);
  auto members = [&](int64_t r, size_t k) {
    const CollectiveRecord& rec = ranks[size_t(r)].plan->comm.attention[k];
    std::vector<int64_t> g;
    if (rec.group)
      for (int q : *rec.group) g.push_back(q);
    else
      for (int64_t q = 0; q < P; ++q) g.push_back(q);
    return g;
  };
  size_t next = 0;  // the first collective not yet started on every rank
  auto start_ready = [&] {
    for (; next < n; ++next) {
      for (int64_t r = 0; r < P; ++r)
        if (ranks[size_t(r)].issued[next] < 0) return;
      for (int64_t r = 0; r < P; ++r) {
        if (end[next * size_t(P) + size_t(r)] >= 0) continue;
        const std::vector<int64_t> g = members(r, next);
        double t0 = 0;
        for (int64_t q : g)
          t0 = std::max({t0, ranks[size_t(q)].issued[next], link_free[size_t(q)]});
        const double t1 = t0 + ranks[size_t(r)].f.collectives[next].seconds;
        for (int64_t q : g) end[next * size_t(P) + size_t(q)] = t1, link_free[size_t(q)] = t1;
      }
    }
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (int64_t r = 0; r < P; ++r) {
      RankReplay& x = ranks[size_t(r)];
      FormPrediction& f = x.f;
      while (!x.done()) {
        const TimelineEvent& e = x.plan->work.timeline[x.pos];
        const bool bwd = x.backward();
        if (e.kind == TimelineEvent::Kind::compute) {
          const WorkRecord& w = x.plan->work.records[size_t(e.index)];
          const double s = work_seconds(w, m, rates);
          ClassTime& ct = f.by_class[bwd][w.cls];
          ct.seconds += s, ct.work += w.work(), ct.calls += 1;
          (bwd ? f.bwd_compute_s : f.fwd_compute_s) += s;
          x.clock += s;
        } else if (e.kind == TimelineEvent::Kind::issue) {
          x.issued[size_t(e.index)] = x.clock;
          start_ready();
        } else {
          const double t1 = end[size_t(e.index) * size_t(P) + size_t(r)];
          if (t1 < 0) break;  // a peer has not issued it yet
          CollectiveTime& t = f.collectives[size_t(e.index)];
          t.backward = bwd;
          t.exposed_s = std::max(0.0, t1 - x.clock);
          x.clock = std::max(x.clock, t1);
          (bwd ? f.bwd_comm_s : f.fwd_comm_s) += t.exposed_s;
          // The part that ran behind compute took the link's host cost of its bytes from that
          // compute (docs/model.md §1).
          if (t.seconds > 0 && t.host_s > 0) {
            // (a wait that rounds a few ulps short of the whole collective hides nothing)
            double hidden = std::max(0.0, t.seconds - t.exposed_s) / t.seconds;
            if (hidden < 1e-9) hidden = 0;
            const double h = t.host_s * hidden;
            (bwd ? f.bwd_compute_s : f.fwd_compute_s) += h;
            f.hidden_host_s += h, x.clock += h;
          }
        }
        ++x.pos, moved = true;
        if (x.pos == x.plan->work.backward_begins) x.fwd_end = x.clock;
      }
    }
  }
  for (const RankReplay& x : ranks)
    LAGA_ASSERT(x.done(), "{}: rank {} waits for a collective no peer issues", m.form, x.f.rank);
  const RankReplay* slowest = &ranks[0];
  for (const RankReplay& x : ranks)
    if (x.clock > slowest->clock) slowest = &x;
  return slowest->f;
}

json FormPrediction::to_json() const {
  json classes = json::object(), coll = json::array();
  for (int b : {0, 1})
    for (const auto& [k, t] : by_class[b])
      classes[b ? "backward" : "forward"][work_class_name(k)] = {
          {"seconds", t.seconds}, {"work", t.work}, {"calls", t.calls}};
  for (const auto& t : collectives)
    coll.push_back({{"op", collective_name(t.record.op)},
                    {"tensor", t.record.tensor},
                    {"dtype", dtype_name(t.record.dtype)},
                    {"pass", t.backward ? "backward" : "forward"},
                    {"tensor_bytes", t.record.tensor_bytes},
                    {"wire_bytes", t.record.wire_bytes},
                    {"size_bytes", t.size_bytes},
                    {"crosses_nodes", t.crosses_nodes},
                    {"busbw_GBps", t.busbw_GBps},
                    {"latency_s", t.latency_s},
                    {"seconds", t.seconds},
                    {"exposed_s", t.exposed_s},
                    {"host_s", t.host_s}});
  return {{"form", form},
          {"rank", rank},
          {"fwd_compute_s", fwd_compute_s},
          {"bwd_compute_s", bwd_compute_s},
          {"fwd_comm_s", fwd_comm_s},
          {"bwd_comm_s", bwd_comm_s},
          {"fwd_s", fwd_s()},
          {"bwd_s", bwd_s()},
          {"comm_s", comm_s()},
          {"total_s", total_s()},
          {"hidden_host_s", hidden_host_s},
          {"by_class", classes},
          {"collectives", coll}};
}

LatencyBandwidthFit fit_latency_bandwidth(const std::vector<double>& x,
                                          const std::vector<double>& y) {
  LAGA_CHECK(x.size() == y.size() && x.size() >= 2,
             "a latency + bandwidth fit needs at least 2 sizes, got {}", x.size());
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    LAGA_CHECK(y[i] > 0 && std::isfinite(y[i]) && x[i] >= 0,
               "fit point {}: time {} s, bytes {} (must be > 0)", i, y[i], x[i]);
    const double w = 1 / (y[i] * y[i]);
    sw += w, sx += w * x[i], sy += w * y[i], sxx += w * x[i] * x[i], sxy += w * x[i] * y[i];
  }
  const double det = sw * sxx - sx * sx;
  LAGA_CHECK(det > 0, "a latency + bandwidth fit needs at least 2 different sizes");
  double b = (sw * sxy - sx * sy) / det, a = (sy - b * sx) / sw;
  if (a < 0) a = 0, b = sxy / sxx;
  LAGA_CHECK(b > 0,
             "the measured times do not grow with the size (slope {}); cannot fit a bandwidth", b);
  LatencyBandwidthFit f;
  f.latency_s = a, f.busbw_GBps = 1 / b / 1e9, f.points = int(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    f.max_rel_residual = std::max(f.max_rel_residual, std::abs(a + b * x[i] - y[i]) / y[i]);
  return f;
}

LinkSpec link_from_bench_comm(const json& j, const std::string& path, int64_t* sp_out) {
  auto bad = [&](const std::string& what) {
    LAGA_FAIL_USAGE("bench-comm file {}: {}", path, what);
  };
  if (!j.is_object() || !j.contains("rows") || !j["rows"].is_array())
    bad("no 'rows' array (write it with laga bench-comm --json)");
  if (!j.contains("sp") || !j["sp"].is_number_integer() || j["sp"].get<int64_t>() < 2)
    bad("field 'sp' is missing or below 2 (a link needs at least two ranks)");
  const int64_t P = j["sp"].get<int64_t>();
  if (sp_out) *sp_out = P;
  std::map<CollectiveOp, std::pair<std::vector<double>, std::vector<double>>> points;
  for (size_t i = 0; i < j["rows"].size(); ++i) {
    const json& row = j["rows"][i];
    const std::string where = fmt::format("rows[{}]", i);
    for (const char* k : {"op", "bytes", "time_s"})
      if (!row.contains(k)) bad(fmt::format("field '{}.{}' is missing", where, k));
    if (!row["op"].is_string() || !row["bytes"].is_number() || !row["time_s"].is_number())
      bad(where + ": op must be a string, bytes and time_s numbers");
    auto op = parse_op(row["op"].get<std::string>());
    if (!op) continue;                         // a collective the model does not use (broadcast)
    if (row.value("wrong", 0) != 0) continue;  // not a valid measurement
    double S = row["bytes"].get<double>();
    const double t = row["time_s"].get<double>();
    // bytes is nccl-tests' S; where algbw = S / t says otherwise, trust algbw's definition.
    if (row.contains("algbw_GBps") && row["algbw_GBps"].is_number() && t > 0) {
      const double s2 = row["algbw_GBps"].get<double>() * 1e9 * t;
      if (s2 > 0 && std::abs(s2 - S) > 0.01 * S) S = s2;
    }
    if (S <= 0 || t <= 0) continue;
    points[*op].first.push_back(S * bus_factor(*op, P));
    points[*op].second.push_back(t);
  }
  LinkSpec l;
  for (CollectiveOp op : kModelledOps) {
    auto it = points.find(op);
    if (it == points.end() || it->second.first.size() < 2)
      bad(fmt::format("fewer than 2 valid sizes of {} (give -b/-e spanning several sizes)",
                      collective_name(op)));
    const LatencyBandwidthFit f = fit_latency_bandwidth(it->second.first, it->second.second);
    l.busbw_GBps[op] = f.busbw_GBps;
    l.latency_op_s[op] = f.latency_s;
    l.latency_s = std::max(l.latency_s, f.latency_s);
  }
  // bench-comm --host-cost: what each op's bytes took from compute running beside it. A negative
  // reading (compute as fast as alone, within noise) is none.
  if (j.contains("host_cost")) {
    if (!j["host_cost"].is_array())
      bad("'host_cost' is not an array (write it with laga bench-comm --host-cost)");
    for (size_t i = 0; i < j["host_cost"].size(); ++i) {
      const json& row = j["host_cost"][i];
      if (!row.is_object() || !row.contains("op") || !row["op"].is_string() ||
          !row.contains("host_ns_per_byte") || !row["host_ns_per_byte"].is_number())
        bad(fmt::format("host_cost[{}] needs a string 'op' and a number 'host_ns_per_byte'", i));
      if (auto op = parse_op(row["op"].get<std::string>()))
        l.host_ns_per_byte[*op] = std::max(0.0, row["host_ns_per_byte"].get<double>());
    }
    for (CollectiveOp op : kModelledOps)
      if (!l.host_ns_per_byte.count(op))
        bad(fmt::format(
            "host_cost has no row for {} (bench-comm --host-cost measures every op it times)",
            collective_name(op)));
  }
  return l;
}

std::map<std::string, double> BenchRowComparison::predicted_by_class() const {
  // bench times the latent kernel's up-projection inside the kernel's call, as the replay does;
  // "other" is the streams (elementwise and accumulate), measured with the rest beside exposed
  // communication.
  std::map<std::string, double> by{
      {"matmul", 0}, {"attention_fwd", 0}, {"attention_bwd", 0}, {"other", 0}};
  for (int b : {0, 1})
    for (const auto& [k, t] : predicted.by_class[b])
      by[by_bytes(k) ? "other" : work_class_name(k)] += t.seconds;
  return by;
}

std::vector<BenchRowComparison> compare_with_bench(const json& bench, const std::string& path,
                                                   const HardwareSpec& hw) {
  auto bad = [&](const std::string& what) { LAGA_FAIL_USAGE("bench file {}: {}", path, what); };
  if (!bench.is_object() || !bench.contains("rows") || !bench["rows"].is_array())
    bad("no 'rows' array (write it with laga bench --json)");
  if (!bench.contains("config") || !bench["config"].is_object()) bad("no 'config' object");
  const MlaConfig base = MlaConfig::from_json(bench["config"]);
  std::vector<BenchRowComparison> out;
  for (size_t i = 0; i < bench["rows"].size(); ++i) {
    const json& row = bench["rows"][i];
    for (const char* k : {"variant", "seq", "sp", "fwd_s", "bwd_s", "comm_s", "total_s"})
      if (!row.contains(k)) bad(fmt::format("field 'rows[{}].{}' is missing", i, k));
    BenchRowComparison c;
    c.seq = row["seq"].get<int64_t>(), c.sp = row["sp"].get<int64_t>();
    c.measured_fwd = row["fwd_s"].get<double>(), c.measured_bwd = row["bwd_s"].get<double>();
    c.measured_comm = row["comm_s"].get<double>(), c.measured_total = row["total_s"].get<double>();
    if (row.contains("comm_skew_s")) {
      if (!row["comm_skew_s"].is_number() || row["comm_skew_s"].get<double>() < 0 ||
          row["comm_skew_s"].get<double>() >= c.measured_total)
        bad(fmt::format("field 'rows[{}].comm_skew_s' must be a number in [0, total_s)", i));
      c.measured_skew = row["comm_skew_s"].get<double>();
    }
    // The row's form as bench ran it: its variant, and laga's --ulysses (the row's "ulysses";
    // absent in files written before bench took --ulysses: 0, the whole group).
    MlaConfig m = as_form(base, row["variant"].get<std::string>());
    m.seq_len = c.seq, m.sp = c.sp,
    m.ulysses = row.contains("ulysses") ? row["ulysses"].get<int64_t>() : 0;
    c.ulysses = m.ulysses, c.variant = m.form;
    c.form = displayed_form(m);
    c.predicted = predict(Config(m), hw);
    if (row.contains("profile")) {
      const json& p = row["profile"];
      for (const char* k : {"matmul", "attention_fwd", "attention_bwd"}) {
        if (!p.contains(k) || !p[k].contains("seconds") || !p[k]["seconds"].is_number())
          bad(fmt::format("field 'rows[{}].profile.{}.seconds' is missing or not a number", i, k));
        c.measured_by_class[k] = p[k]["seconds"].get<double>();
      }
      if (!p.contains("other_s") || !p["other_s"].is_number())
        bad(fmt::format("field 'rows[{}].profile.other_s' is missing or not a number", i));
      // The streams' classes (absent from files written before bench timed them) and the rest.
      c.measured_by_class["other"] = p["other_s"].get<double>();
      for (const char* k : {"elementwise", "accumulate"})
        if (p.contains(k) && p[k].contains("seconds") && p[k]["seconds"].is_number())
          c.measured_by_class["other"] += p[k]["seconds"].get<double>();
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace laga
