// laga model --published FILE: the model beside published measurements (docs/model.md, "Beside
// published measurements"). FILE (docs/published.json) lists rows, each a published ratio of two
// configurations' speeds (a form over a baseline) with everything the row assumes: the model's
// dimensions, T, P, layers, kernel, dtype, a hardware file, the placement of the group on nodes,
// how each side maps to a registered form, and the time of the step outside attention where the
// publication measured a whole model. Each side is predicted with predict(); the command prints and
// writes the prediction, the published number, their difference, the share outside attention at
// which the two would agree, and, for a difference above 10 %, the data file's explanation.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "cli.hpp"
#include "commands.hpp"
#include "laga/core/error.hpp"
#include "laga/driver/model.hpp"

namespace laga::cli {

namespace {

using nlohmann::json;

// A difference beyond this needs the data file's "why".
constexpr double kExplainAbove = 0.10;

// Reads FILE's fields; every problem is a usage error (exit 2) naming the file and the field's
// path.
struct Reader {
  std::string file;

  [[noreturn]] void fail(const std::string& path, const std::string& problem) const {
    LAGA_FAIL_USAGE("published file {}: field '{}' {}", file, path, problem);
  }
  const json& child(const json& o, const std::string& path, const std::string& key,
                    const std::string& want) const {
    const std::string p = path.empty() ? key : path + "." + key;
    if (!o.is_object() || !o.contains(key)) fail(p, "is missing; give " + want);
    return o.at(key);
  }
  std::string text(const json& o, const std::string& path, const std::string& key,
                   const std::string& want) const {
    const json& v = child(o, path, key, want);
    if (!v.is_string() || v.get<std::string>().empty())
      fail(path + "." + key,
           fmt::format("= {} is not a non-empty string; give {}", v.dump(), want));
    return v.get<std::string>();
  }
  double number(const json& o, const std::string& path, const std::string& key,
                const std::string& want) const {
    const json& v = child(o, path, key, want);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
      fail(path + "." + key, fmt::format("= {} is not a positive number; give {}", v.dump(), want));
    return v.get<double>();
  }
  int64_t integer(const json& o, const std::string& path, const std::string& key,
                  const std::string& want) const {
    const json& v = child(o, path, key, want);
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      fail(path + "." + key,
           fmt::format("= {} is not a positive integer; give {}", v.dump(), want));
    return v.get<int64_t>();
  }
  bool boolean(const json& o, const std::string& path, const std::string& key,
               const std::string& want) const {
    const json& v = child(o, path, key, want);
    if (!v.is_boolean()) fail(path + "." + key, fmt::format("= {} is not true or false", v.dump()));
    return v.get<bool>();
  }
  // An object whose keys are all in `known` (a typo is refused, not ignored).
  const json& object(const json& v, const std::string& path, const std::set<std::string>& known,
                     const std::string& want) const {
    if (!v.is_object()) fail(path, fmt::format("= {} is not an object; give {}", v.dump(), want));
    for (const auto& [k, _] : v.items())
      if (!known.count(k)) {
        std::string valid;
        for (const auto& n : known) valid += (valid.empty() ? "" : ", ") + n;
        fail(path + "." + k, "is not a known field; valid: " + valid);
      }
    return v;
  }
};

// One side of a row: a registered form, overlap, and a factor on the link bandwidths that stands
// for a traffic the forms do not send as such (why says which).
struct Side {
  std::string form;
  bool overlap = false;
  double link_scale = 1;
  std::string link_scale_why;
  json to_json() const {
    json j = {{"form", form}, {"overlap", overlap}, {"link_scale", link_scale}};
    if (!link_scale_why.empty()) j["link_scale_why"] = link_scale_why;
    return j;
  }
};

Side read_side(const Reader& r, const json& row, const std::string& path, const char* key) {
  const std::string p = path + "." + key;
  const json& s =
      r.object(r.child(row, path, key, "an object {form, overlap}"), p,
               {"form", "overlap", "link_scale", "link_scale_why"}, "an object {form, overlap}");
  Side side;
  side.form = r.text(s, p, "form", "a registered form label, e.g. laga");
  side.overlap = r.boolean(s, p, "overlap", "true or false");
  if (s.contains("link_scale")) {
    side.link_scale = r.number(s, p, "link_scale", "a positive factor on the link bandwidths");
    side.link_scale_why =
        r.text(s, p, "link_scale_why", "what traffic the factor stands for and how it follows");
  }
  return side;
}

// The time outside attention: none (the publication timed attention alone), a share of one side's
// step, or FLOPs per token at the hardware file's matmul rate.
struct Outside {
  std::string method, how, of;
  double share = 0, flops_per_token = 0;
};

Outside read_outside(const Reader& r, const json& row, const std::string& path) {
  const std::string p = path + ".outside_attention";
  const json& o =
      r.object(r.child(row, path, "outside_attention", "an object {method, how}"), p,
               {"method", "how", "share", "of", "flops_per_token"}, "an object {method, how}");
  Outside out;
  out.method = r.text(o, p, "method", "none, share or flops");
  out.how = r.text(o, p, "how", "how the time outside attention was obtained");
  if (out.method == "share") {
    const json& s = r.child(o, p, "share", "a number in [0, 1)");
    if (!s.is_number() || !(s.get<double>() >= 0 && s.get<double>() < 1))
      r.fail(p + ".share", fmt::format("= {} is not in [0, 1)", s.dump()));
    out.share = s.get<double>();
    out.of = r.text(o, p, "of", "form or baseline: whose step the share is of");
    if (out.of != "form" && out.of != "baseline")
      r.fail(p + ".of", fmt::format("= '{}' is neither form nor baseline", out.of));
  } else if (out.method == "flops") {
    out.flops_per_token =
        r.number(o, p, "flops_per_token", "the training FLOPs per token outside attention");
  } else if (out.method != "none") {
    r.fail(p + ".method", fmt::format("= '{}' is not one of none, share, flops", out.method));
  }
  return out;
}

// The model's dimensions: a preset, or one of the file's "models" (a preset with dimensions
// replaced).
const std::set<std::string> kDims = {"hidden_size",  "num_attention_heads", "q_lora_rank",
                                     "kv_lora_rank", "qk_nope_head_dim",    "qk_rope_head_dim",
                                     "v_head_dim"};

MlaConfig model_dims(const Reader& r, const json& doc, const std::string& name,
                     const std::string& path) {
  if (doc.contains("models") && doc.at("models").contains(name)) {
    const std::string p = "models." + name;
    std::set<std::string> known = kDims;
    known.insert({"preset", "notes", "source"});
    const json& m = r.object(doc.at("models").at(name), p, known, "an object {preset, dims}");
    const std::string preset = r.text(m, p, "preset", "the preset the dimensions replace");
    const auto presets = MlaConfig::preset_names();
    if (std::find(presets.begin(), presets.end(), preset) == presets.end())
      r.fail(p + ".preset", fmt::format("= '{}' is not a preset", preset));
    MlaConfig c = MlaConfig::preset(preset);
    c.model = name;
    auto dim = [&](const char* k, int64_t& field) {
      if (m.contains(k)) {
        const json& v = m.at(k);
        if (!v.is_number_integer() || v.get<int64_t>() < 0)
          r.fail(p + "." + k, fmt::format("= {} is not an integer >= 0", v.dump()));
        field = v.get<int64_t>();
      }
    };
    dim("hidden_size", c.hidden_size), dim("num_attention_heads", c.num_attention_heads);
    dim("q_lora_rank", c.q_lora_rank), dim("kv_lora_rank", c.kv_lora_rank);
    dim("qk_nope_head_dim", c.qk_nope_head_dim), dim("qk_rope_head_dim", c.qk_rope_head_dim);
    dim("v_head_dim", c.v_head_dim);
    return c;
  }
  const auto presets = MlaConfig::preset_names();
  if (std::find(presets.begin(), presets.end(), name) == presets.end()) {
    std::string valid;
    for (const auto& n : presets) valid += n + ", ";
    r.fail(path + ".model",
           fmt::format("= '{}' is neither a preset nor in the file's models; valid: {}models' keys",
                       name, valid));
  }
  return MlaConfig::preset(name);
}

HardwareSpec scaled(HardwareSpec hw, double s) {
  for (auto& [op, bw] : hw.intra_node.busbw_GBps) bw *= s;
  if (hw.inter_node)
    for (auto& [op, bw] : hw.inter_node->busbw_GBps) bw *= s;
  return hw;
}

const std::set<std::string> kRowFields = {"id",
                                          "publication",
                                          "url",
                                          "states",
                                          "published",
                                          "model",
                                          "seq",
                                          "sp",
                                          "layers",
                                          "batch",
                                          "kernel",
                                          "dtype",
                                          "hw",
                                          "ranks_per_node",
                                          "ranks_per_node_why",
                                          "link",
                                          "form",
                                          "baseline",
                                          "outside_attention",
                                          "assumptions",
                                          "mapping",
                                          "why",
                                          "notes"};

// One row: read, predicted, compared.
json predict_row(const Reader& r, const json& doc, const json& row, const std::string& path,
                 const std::filesystem::path& dir, json& hardware) {
  r.object(row, path, kRowFields, "an object (docs/model.md)");
  json out;
  out["id"] = r.text(row, path, "id", "a short unique name");
  out["publication"] = r.text(row, path, "publication", "who published the measurement");
  out["url"] = r.text(row, path, "url", "where it is published");
  out["states"] = r.text(row, path, "states", "what the publication states, in a sentence");

  // The published ratio: a number, or the two sides' figures and which way is better.
  const json& pub = r.child(row, path, "published", "a speed ratio, or {form, baseline, unit}");
  double published = 0;
  if (pub.is_object()) {
    const std::string p = path + ".published";
    r.object(pub, p, {"form", "baseline", "unit", "higher_is_better"},
             "{form, baseline, unit, higher_is_better}");
    const double a = r.number(pub, p, "form", "the form's published figure");
    const double b = r.number(pub, p, "baseline", "the baseline's published figure");
    const std::string unit = r.text(pub, p, "unit", "the figures' unit, e.g. tokens/s");
    const bool higher = r.boolean(pub, p, "higher_is_better", "true for a rate, false for a time");
    published = higher ? a / b : b / a;
    out["published_figures"] = {
        {"form", a}, {"baseline", b}, {"unit", unit}, {"higher_is_better", higher}};
  } else {
    published = r.number(row, path, "published", "the published speed ratio, form over baseline");
  }

  MlaConfig c = model_dims(r, doc, r.text(row, path, "model", "a preset or a key of models"), path);
  c.seq_len = r.integer(row, path, "seq", "the global sequence length T");
  c.sp = r.integer(row, path, "sp", "the ranks of the sequence-parallel group P");
  c.num_layers = r.integer(row, path, "layers", "the attention layers of the step");
  c.batch = r.integer(row, path, "batch", "the micro-batch B");
  c.kernel = parse_kernel(r.text(row, path, "kernel", "fused or eager"));
  c.dtype = parse_dtype(r.text(row, path, "dtype", "bf16 or fp32"));

  const std::string hw_rel = r.text(row, path, "hw", "a hardware file, relative to this file");
  HardwareSpec hw = HardwareSpec::load((dir / hw_rel).string());
  std::string rpn_why;
  if (row.contains("ranks_per_node")) {
    hw.ranks_per_node = r.integer(row, path, "ranks_per_node", "the group's ranks on one node");
    rpn_why = r.text(row, path, "ranks_per_node_why", "why the group sits so on the nodes");
  }
  const std::string link = r.text(row, path, "link", "the links between the group's ranks");
  const Side form = read_side(r, row, path, "form"), base = read_side(r, row, path, "baseline");
  const Outside outside = read_outside(r, row, path);
  const std::string mapping = r.text(row, path, "mapping", "how the row maps to laga's forms");
  json assumptions = json::array();
  if (row.contains("assumptions")) {
    const json& a = row.at("assumptions");
    if (!a.is_array()) r.fail(path + ".assumptions", "is not an array of strings");
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_string()) r.fail(fmt::format("{}.assumptions[{}]", path, i), "is not a string");
      assumptions.push_back(a[i]);
    }
  }

  // The attention of each side: predict() on its form, overlap and links.
  auto attention = [&](const Side& s, const char* key) {
    MlaConfig m = c;
    m.form = s.form, m.overlap = s.overlap;
    try {
      return predict(Config(m), scaled(hw, s.link_scale));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::usage) throw;
      LAGA_FAIL_USAGE("published file {}: {}.{} ({}): {}", r.file, path, key, s.form, e.message());
    }
  };
  const FormPrediction pf = attention(form, "form"), pb = attention(base, "baseline");
  const double af = pf.total_s(), ab = pb.total_s();
  double o = 0;
  if (outside.method == "share")
    o = outside.share / (1 - outside.share) * (outside.of == "form" ? af : ab);
  else if (outside.method == "flops")
    o = outside.flops_per_token * double(c.tokens_per_rank() * c.batch) /
        (hw.compute_for(c.dtype).matmul_tflops.at(c.seq_len) * 1e12);
  const double predicted = (o + ab) / (o + af);
  const double diff = predicted / published - 1;
  // The share of the baseline's step outside attention at which the prediction equals the
  // published ratio: (O + ab) / (O + af) = p; none when no O >= 0 reaches it.
  json to_match = nullptr;
  if (published != 1) {
    const double om = (ab - published * af) / (published - 1);
    if (om >= 0 && std::isfinite(om)) to_match = om / (om + ab);
  }

  json outside_j = {{"method", outside.method},
                    {"how", outside.how},
                    {"seconds", o},
                    {"share_of_baseline_step", o / (o + ab)},
                    {"share_of_form_step", o / (o + af)}};
  if (outside.method == "share") outside_j["share"] = outside.share, outside_j["of"] = outside.of;
  if (outside.method == "flops") outside_j["flops_per_token"] = outside.flops_per_token;
  json assumes = {{"model", c.model},
                  {"dims",
                   {{"hidden_size", c.hidden_size},
                    {"num_attention_heads", c.num_attention_heads},
                    {"q_lora_rank", c.q_lora_rank},
                    {"kv_lora_rank", c.kv_lora_rank},
                    {"qk_nope_head_dim", c.qk_nope_head_dim},
                    {"qk_rope_head_dim", c.qk_rope_head_dim},
                    {"v_head_dim", c.v_head_dim}}},
                  {"seq", c.seq_len},
                  {"sp", c.sp},
                  {"layers", c.num_layers},
                  {"batch", c.batch},
                  {"kernel", kernel_name(c.kernel)},
                  {"dtype", dtype_name(c.dtype)},
                  {"hw_file", hw_rel},
                  {"hw_name", hw.name},
                  {"ranks_per_node", hw.ranks_per_node},
                  {"link", link},
                  {"form", form.to_json()},
                  {"baseline", base.to_json()},
                  {"outside_attention", outside_j},
                  {"assumptions", assumptions},
                  {"mapping", mapping}};
  if (!rpn_why.empty()) assumes["ranks_per_node_why"] = rpn_why;
  out["assumes"] = assumes;
  out["predicted"] = {{"speedup", predicted},       {"form_attention_s", af},
                      {"baseline_attention_s", ab}, {"outside_s", o},
                      {"form_step_s", o + af},      {"baseline_step_s", o + ab}};
  out["published"] = published;
  out["difference"] = diff;
  out["within_10_percent"] = std::abs(diff) <= kExplainAbove;
  out["share_outside_to_match"] = to_match;
  out["why"] = nullptr;
  if (row.contains("why")) out["why"] = r.text(row, path, "why", "why the two differ");
  out["why_missing"] = std::abs(diff) > kExplainAbove && out["why"].is_null();
  if (!hardware.contains(hw_rel)) hardware[hw_rel] = hw.to_json();
  return out;
}

std::string pct(const json& share) {
  return share.is_null() ? "-" : fmt::format("{:.0f} %", 100 * share.get<double>());
}

void print_rows(const std::string& file, const json& rows) {
  fmt::print(
      "laga model --published {}: {} rows, each a published speed ratio of a form over a baseline "
      "beside the model's (per rank, forward + backward; the row's assumptions below the table)\n",
      file, rows.size());
  fmt::print("# {:<30} {:>9} {:>9} {:>7} {:>9} {:>9}  {}\n", "row", "published", "predicted",
             "diff", "outside", "to match", "hardware");
  fmt::print("# {:<30} {:>9} {:>9} {:>7} {:>9} {:>9}\n", "", "×", "×", "%", "share", "share");
  for (const auto& r : rows)
    fmt::print("  {:<30} {:>9.3f} {:>9.3f} {:>+7.1f} {:>9} {:>9}  {}{}\n",
               r["id"].get<std::string>(), r["published"].get<double>(),
               r["predicted"]["speedup"].get<double>(), 100 * r["difference"].get<double>(),
               pct(r["assumes"]["outside_attention"]["share_of_baseline_step"]),
               pct(r["share_outside_to_match"]), r["assumes"]["hw_file"].get<std::string>(),
               r["within_10_percent"].get<bool>() ? "" : "  (> 10 %: why below)");
  fmt::print(
      "# outside share: of the baseline's predicted step, the time outside attention; to match: "
      "the "
      "share at which the prediction would equal the published ratio (- where none would)\n");
  for (const auto& r : rows) {
    const json& a = r["assumes"];
    fmt::print("\n## {}: {} ({})\n", r["id"].get<std::string>(),
               r["publication"].get<std::string>(), r["url"].get<std::string>());
    fmt::print("  states: {}\n", r["states"].get<std::string>());
    const json& d = a["dims"];
    fmt::print(
        "  assumes: {} (D {}, H {}, Lq {}, Lkv {}, Dn {}, Dr {}, Dv {}), T {}, P {}, L {}, B {}, "
        "{}, {}; {} ({} ranks per node{})\n",
        a["model"].get<std::string>(), d["hidden_size"].get<int64_t>(),
        d["num_attention_heads"].get<int64_t>(), d["q_lora_rank"].get<int64_t>(),
        d["kv_lora_rank"].get<int64_t>(), d["qk_nope_head_dim"].get<int64_t>(),
        d["qk_rope_head_dim"].get<int64_t>(), d["v_head_dim"].get<int64_t>(),
        a["seq"].get<int64_t>(), a["sp"].get<int64_t>(), a["layers"].get<int64_t>(),
        a["batch"].get<int64_t>(), a["kernel"].get<std::string>(), a["dtype"].get<std::string>(),
        a["hw_file"].get<std::string>(), a["ranks_per_node"].get<int64_t>(),
        a.contains("ranks_per_node_why") ? ": " + a["ranks_per_node_why"].get<std::string>()
                                         : std::string());
    fmt::print("  link: {}\n", a["link"].get<std::string>());
    auto side = [](const json& s) {
      std::string t = fmt::format("{} (overlap {}", s["form"].get<std::string>(),
                                  s["overlap"].get<bool>() ? "on" : "off");
      if (s["link_scale"].get<double>() != 1)
        t += fmt::format(", links × {:.4g}: {}", s["link_scale"].get<double>(),
                         s["link_scale_why"].get<std::string>());
      return t + ")";
    };
    fmt::print("  form {} over baseline {}\n", side(a["form"]), side(a["baseline"]));
    const json& o = a["outside_attention"];
    fmt::print("  outside attention: {} ({:.0f} % of the baseline's step): {}\n",
               o["method"].get<std::string>(), 100 * o["share_of_baseline_step"].get<double>(),
               o["how"].get<std::string>());
    for (const auto& s : a["assumptions"]) fmt::print("  assumption: {}\n", s.get<std::string>());
    fmt::print("  mapping: {}\n", a["mapping"].get<std::string>());
    const json& p = r["predicted"];
    fmt::print(
        "  predicted: attention {:.4g} s vs {:.4g} s, outside {:.4g} s: {:.3f}×; published {:.3f}× "
        "({:+.1f} %)\n",
        p["form_attention_s"].get<double>(), p["baseline_attention_s"].get<double>(),
        p["outside_s"].get<double>(), p["speedup"].get<double>(), r["published"].get<double>(),
        100 * r["difference"].get<double>());
    if (!r["why"].is_null()) fmt::print("  why: {}\n", r["why"].get<std::string>());
    if (r["why_missing"].get<bool>())
      fmt::print("  why: none given in {} for a difference above 10 %\n", file);
  }
}

}  // namespace

int cmd_model_published(const std::string& file, const std::string& json_path) {
  auto json_out = open_output(json_path, "--json");
  std::ifstream in(file);
  LAGA_CHECK(in.good(), "published file {}: cannot open ({}); give docs/published.json", file,
             std::strerror(errno));
  const json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
  LAGA_CHECK(!doc.is_discarded(), "published file {}: not valid JSON", file);
  const Reader r{file};
  r.object(doc, "", {"rows", "models", "notes", "source"}, "an object {rows, models}");
  const json& rows = r.child(doc, "", "rows", "an array of rows");
  if (!rows.is_array() || rows.empty()) r.fail("rows", "is not a non-empty array");
  const std::filesystem::path dir = std::filesystem::path(file).parent_path();
  json out_rows = json::array(), hardware = json::object();
  std::set<std::string> ids;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string path = fmt::format("rows[{}]", i);
    json row = predict_row(r, doc, rows[i], path, dir, hardware);
    if (!ids.insert(row["id"].get<std::string>()).second)
      r.fail(path + ".id",
             fmt::format("= '{}' repeats an earlier row's", row["id"].get<std::string>()));
    out_rows.push_back(std::move(row));
  }
  print_rows(file, out_rows);
  if (json_out)
    *json_out << json{{"command", "model --published"},
                      {"file", file},
                      {"explain_above", kExplainAbove},
                      {"rows", out_rows},
                      {"hardware", hardware}}
                     .dump(2)
              << "\n";
  return 0;
}

}  // namespace laga::cli
