// The registry of forms: one line per form. A form added here appears in every command (plan, run,
// verify, bench, train), every test sweep over forms, and every label table.
#include <algorithm>
#include <memory>

#include "laga/mla/form.hpp"

namespace laga {

namespace forms {
const Form& explicit_form();
const Form& absorbed_expanded_form();
const Form& absorbed_shared_form();
const Form& laga_form();
const Form& explicit_recompute_form();
const Form& laga_recompute_form();
const Form& laga_fused_form();
const Form& ring_kv_form();
const Form& ring_latent_form();
const Form& laga_ulysses_form();
const Form& dsa_gather_form();
const Form& dsa_regather_form();
}  // namespace forms

const std::vector<const Form*>& registered_forms() {
  static const std::vector<const Form*> all = {
      &forms::explicit_form(),           &forms::absorbed_expanded_form(),
      &forms::absorbed_shared_form(),    &forms::laga_form(),
      &forms::explicit_recompute_form(), &forms::laga_recompute_form(),
      &forms::laga_fused_form(),         &forms::ring_kv_form(),
      &forms::ring_latent_form(),        &forms::laga_ulysses_form(),
      &forms::dsa_gather_form(),         &forms::dsa_regather_form(),
  };
  return all;
}

const Form* find_form_or_null(std::string_view name) {
  for (const Form* f : registered_forms())
    if (f->name() == name) return f;
  return nullptr;
}

const Form& form_of(const MlaConfig& c) { return find_form(c.form); }

namespace {

// The one alias rule: a registered form that takes no --ulysses, spelled with a --ulysses other
// than --sp (Pu = P: one group of every rank, the form itself), names the form that runs its head
// scatter in groups (Form::ulysses_of); any other spelling stays.
std::string_view ulysses_alias(std::string_view form, const RunShape& shape) {
  const Form* named = find_form_or_null(form);
  if (named && !named->takes_ulysses() && shape.ulysses > 0 && shape.ulysses != shape.sp)
    for (const Form* f : registered_forms())
      if (f->ulysses_of() == form) return f->name();
  return form;
}

}  // namespace

MlaConfig resolved(MlaConfig c) {
  c.form = std::string(ulysses_alias(c.form, c));
  const Form* f = find_form_or_null(c.form);
  if (f && f->takes_ulysses() && c.ulysses == 0) c.ulysses = f->default_ulysses(c);
  return c;
}

MlaConfig as_form(MlaConfig c, std::string_view name) {
  c.form = std::string(name);
  const Form* f = find_form_or_null(name);
  if (!f || !f->takes_ulysses()) c.ulysses = 0;
  return resolved(std::move(c));
}

std::string displayed_form(const MlaConfig& c) {
  const Form* f = find_form_or_null(c.form);
  if (f && f->takes_ulysses() && c.ulysses > 0)
    return fmt::format("{} (ulysses {})", c.form, c.ulysses);
  return c.form;
}

std::string_view kernel_instead(const Form& f, Kernel k) {
  return f.own_kernel() == kernel_name(k) ? std::string_view() : f.own_kernel();
}

std::string ulysses_form_names() {
  std::string s;
  for (const Form* f : registered_forms())
    if (f->takes_ulysses()) s += (s.empty() ? "" : ", ") + std::string(f->name());
  return s;
}

std::string form_names() {
  std::string s;
  for (const Form* f : registered_forms()) s += (s.empty() ? "" : ", ") + std::string(f->name());
  return s;
}

const Form& find_form(std::string_view name) {
  const Form* f = find_form_or_null(name);
  LAGA_CHECK(f, "unknown form '{}'; valid: {}", name, form_names());
  return *f;
}

FormsAt judge_forms(const MlaConfig& c) {
  if (auto p = c.problems_apart_from_form(); !p.empty()) {
    std::string msg = fmt::format("invalid configuration (model '{}'): ", c.model);
    for (size_t i = 0; i < p.size(); ++i) msg += (i ? "; " : "") + p[i];
    LAGA_FAIL_USAGE("{}", msg);
  }
  FormsAt at;
  for (const Form* f : registered_forms()) {
    const MlaConfig m = as_form(c, f->name());
    std::vector<std::string> p;
    f->add_problems(m, p);
    if (p.empty())
      at.runnable.push_back(f);
    else
      at.refused.push_back({f, p.front()});
  }
  return at;
}

FormsAt forms_at(const MlaConfig& c) {
  FormsAt at = judge_forms(c);
  if (at.runnable.empty()) {
    std::string msg;
    for (const auto& r : at.refused)
      msg += fmt::format("{}{}: {}", msg.empty() ? "" : "; ", r.form->name(), r.reason);
    LAGA_FAIL_USAGE("invalid configuration (model '{}'): no form can run it: {}", c.model, msg);
  }
  return at;
}

std::string FormsAt::refusal(const Form& f) const {
  for (const auto& r : refused)
    if (r.form == &f) return r.reason;
  return {};
}

std::string resolve_form_label(std::string_view form, std::string_view regime,
                               const RunShape& shape) {
  if (find_form_or_null(form)) return std::string(ulysses_alias(form, shape));
  std::vector<std::string> regimes;
  for (const Form* f : registered_forms())
    if (f->family() == form && !f->regime().empty()) regimes.emplace_back(f->regime());
  LAGA_CHECK(!regimes.empty(),
             "unknown form '{}'; valid: {} (or a family with its regime, e.g. absorbed "
             "--absorbed-kv shared)",
             form, form_names());
  const std::string label = std::string(form) + "-" + std::string(regime);
  LAGA_CHECK(find_form_or_null(label), "unknown {} regime '{}'; valid: {}", form, regime, [&] {
    std::string s;
    for (const auto& v : regimes) s += (s.empty() ? "" : ", ") + v;
    return s;
  }());
  return label;
}

void Form::add_head_scatter_problems(const MlaConfig& c, std::vector<std::string>& p) {
  if (c.sp > 0 && c.num_attention_heads > 0 && c.num_attention_heads % c.sp)
    p.push_back(fmt::format("--sp {} does not divide num_attention_heads {}; try {}", c.sp,
                            c.num_attention_heads, divisors_str(c.num_attention_heads)));
}

std::string_view token_layout_name(TokenLayout layout) {
  switch (layout) {
    case TokenLayout::contiguous:
      return "contiguous";
    case TokenLayout::zigzag:
      return "zigzag";
    case TokenLayout::zigzag_groups:
      return "zigzag over groups";
  }
  return "unknown";
}

std::vector<TokenSegment> token_segments(const MlaConfig& c, int64_t rank) {
  const int64_t P = c.sp, N = c.tokens_per_rank();
  const TokenLayout layout = form_of(c).layout(c);
  if (layout == TokenLayout::contiguous) return {{rank * N, N}};
  if (layout == TokenLayout::zigzag) {
    const int64_t C = c.seq_len / (2 * P);
    return {{rank * C, C}, {(2 * P - 1 - rank) * C, C}};
  }
  // zigzag_groups: group g = rank / Pu holds chunks g and 2Pr−1−g of C = T/(2Pr), concatenated; its
  // rank u = rank % Pu holds rows [u·N, (u+1)·N) of that concatenation (one segment, or two when
  // the rows straddle the chunks' seam).
  const int64_t Pu = c.head_group(), Pr = c.ring_groups(), g = rank / Pu, u = rank % Pu,
                C = c.seq_len / (2 * Pr);
  const int64_t lo = u * N, hi = lo + N;
  std::vector<TokenSegment> segs;
  const int64_t chunk_pos[2] = {g * C, (2 * Pr - 1 - g) * C};
  for (int k = 0; k < 2; ++k) {
    const int64_t a = std::max(lo, k * C), b = std::min(hi, (k + 1) * C);
    if (a < b) segs.push_back({chunk_pos[k] + (a - k * C), b - a});
  }
  return segs;
}

RankCtx::RankCtx(const Config& cfg, Communicator& cm)
    : c(*cfg),
      comm(cm),
      P(cm.size()),
      r(cm.rank()),
      N(cfg->tokens_per_rank()),
      T(cfg->seq_len),
      B(cfg->batch),
      D(cfg->hidden_size),
      H(cfg->num_attention_heads),
      Hr(cfg->heads_per_rank()),
      Lq(cfg->q_lora_rank),
      Lkv(cfg->kv_lora_rank),
      Dn(cfg->qk_nope_head_dim),
      Dr(cfg->qk_rope_head_dim),
      Dqk(cfg->qk_head_dim()),
      Dv(cfg->v_head_dim),
      Dl(cfg->latent_dim()),
      pos0(cm.rank() * cfg->tokens_per_rank()),
      segments(token_segments(*cfg, cm.rank())),
      dt(cfg->dtype),
      Pu(cfg->head_group()),
      Pr(cfg->ring_groups()),
      g(cm.rank() / cfg->head_group()),
      u(cm.rank() % cfg->head_group()) {
  LAGA_CHECK(cfg->sp == cm.size(),
             "config says --sp {} but the group has {} ranks; run with --sp {}", cfg->sp, cm.size(),
             cm.size());
  if (Pr > 1) {  // collective over the group: every rank makes its RankCtx at the same point
    const int64_t pu = Pu;
    heads_group = std::shared_ptr<Communicator>(cm.split([pu](int q) {
      return SplitKey{int(q / pu), int(q % pu)};
    }));
    ring = std::shared_ptr<Communicator>(cm.split([pu](int q) {
      return SplitKey{int(q % pu), int(q / pu)};
    }));
  }
}

}  // namespace laga
