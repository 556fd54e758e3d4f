// A form: one way of computing the attention core of the MLA block under sequence parallelism —
// everything between the local stage (q and the latent of this rank's tokens) and the output
// projection (o of this rank's tokens). Each form is one source file in src/mla/forms/ implementing
// this interface: its forward and backward, its own saved state, and the configurations it refuses.
// Its memory, traffic, work and timeline are its own code run on meta tensors (driver/plan.hpp),
// so nothing is written twice.
//
// The registry (src/mla/forms/registry.cpp) lists every form; every command, test sweep and report
// iterates it, so a new form appears everywhere by being registered. The dataflow of each form is
// in docs/design.md §2; how to add one, in docs/architecture.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/core/tensor.hpp"
#include "laga/mla/config.hpp"
#include "laga/mla/weights.hpp"

namespace laga {

// Which global tokens a rank holds. contiguous: rank r holds [r·N, (r+1)·N) (the head-scatter
// forms). zigzag: the sequence cut into 2P chunks of C = T/(2P), rank r holds chunks r and 2P−1−r,
// in that order (the ring forms: under causal attention every rank then has the same work).
// zigzag_groups (laga-ulysses, --ulysses Pu): the sequence cut into 2Pr chunks, group g (ranks
// g·Pu .. g·Pu + Pu − 1) holds chunks g and 2Pr−1−g concatenated, and its rank u holds rows
// [u·N, (u+1)·N) of that concatenation (one or two segments).
enum class TokenLayout { contiguous, zigzag, zigzag_groups };
std::string_view token_layout_name(TokenLayout layout);

// A run of global token positions [pos0, pos0 + len) held by one rank, as len consecutive local
// rows.
struct TokenSegment {
  int64_t pos0 = 0, len = 0;
};
// The segments of rank `rank` for config c (its form's layout), in local order: the one mechanism
// by which every local token maps to its global position (RoPE in the block; the driver's inputs,
// gathered outputs and dumps). Their lengths add up to N = T/P.
std::vector<TokenSegment> token_segments(const MlaConfig& c, int64_t rank);

// One rank's view of a layer's work: the validated config, the group, and the dimension letters of
// docs/design.md §1 for this rank.
struct RankCtx {
  const MlaConfig& c;
  Communicator& comm;
  int64_t P, r;  // ranks, this rank
  int64_t N, T, B, D, H, Hr, Lq, Lkv, Dn, Dr, Dqk, Dv, Dl;
  int64_t pos0;  // global position of this rank's first token: r·N (contiguous layout)
  std::vector<TokenSegment> segments;  // token_segments(c, r)
  DType dt;
  // laga-ulysses with Pu < P (c.hybrid()): Pu ranks per head-scatter group, Pr groups on the ring,
  // this rank's group g and place u in it, and the two sub-communicators (split from comm here, so
  // making a RankCtx is collective then); Hr = H/Pu. Otherwise Pu = P, Pr = 1, g = 0, u = r and
  // both null.
  int64_t Pu, Pr, g, u;
  std::shared_ptr<Communicator> heads_group;  // ranks g·Pu .. g·Pu + Pu − 1, rank u
  std::shared_ptr<Communicator> ring;         // ranks u, Pu + u, ..., rank g
  // Where the head-scatter all-to-alls (q, o and their adjoints) run: the group, or the whole comm.
  Communicator& heads_comm() const { return heads_group ? *heads_group : comm; }
  RankCtx(const Config& c, Communicator& comm);  // the group must have c->sp ranks
};

// What a form's forward keeps for its backward (tags "act.*"). Each form defines its own.
struct CoreSaved {
  virtual ~CoreSaved() = default;
  // Every tensor held, by name: for --check-finite and for tests.
  virtual void for_each(const std::function<void(const char* name, const Tensor&)>& f) const = 0;
};

// The block's query path, run by the core's forward where it wants q: returns q_local [N, B, H,
// Dqk] (after RoPE). With it, the local stage's tensors the lightning indexer reads (the sparse
// forms, Form::sparse): detached inputs, so the indexer's gradient reaches its own weights alone.
struct QueryPath {
  std::function<Tensor()> run;
  const Tensor* xn = nullptr;   // [N, B, D]   RMSNorm(x) (x with attention_only)
  const Tensor* cqn = nullptr;  // [N, B, Lq]  RMSNorm(cq): defined once run() has run
  Tensor operator()() const { return run(); }
};
// Its backward, run by the core's backward: takes dq_local [N, B, H, Dqk]. xn and cqn stay defined
// until it has run.
struct QueryPathBackward {
  std::function<void(Tensor dq_local)> run;
  const Tensor* xn = nullptr;
  const Tensor* cqn = nullptr;
  void operator()(Tensor dq_local) const { run(std::move(dq_local)); }
};

class Form {
 public:
  virtual ~Form() = default;
  // the registry label: "explicit", "absorbed-shared", ...
  virtual std::string_view name() const = 0;
  // "absorbed" for both absorbed variants; else the name
  virtual std::string_view family() const = 0;
  // A variant's regime, its label after its family ("shared" of absorbed-shared: --absorbed-kv);
  // empty for a form that is its own family.
  std::string_view regime() const {
    return family() == name() ? std::string_view() : name().substr(family().size() + 1);
  }
  virtual std::string_view summary() const = 0;  // one line: what moves and what each rank computes

  // The core's forward: latent [N, B, Dl] = [ckv | kpe] of this rank's tokens -> o [T, B, Hr, Dv]
  // of this rank's heads over the whole sequence. The block's query path (L1–L3 and q's RoPE) is
  // handed in as `query`, which the form calls exactly once, where it wants q_local [N, B, H, Dqk]:
  // after issuing what it can issue from the latent alone, so those collectives run behind the
  // query path (laga: the latent all-gather; explicit: k's and v's all-to-alls). The latent is the
  // form's to keep or release; what backward needs goes into `saved`. Every collective meant to run
  // behind compute is issued through issue() (forms/common.hpp): with the run's overlap on it stays
  // in flight until its output is needed, with overlap off it is waited where it is issued — the
  // same code, the same operations in the same order, so the same bits. One with nothing to run
  // behind it is started and waited at once.
  virtual Tensor forward(const RankCtx& ctx, const LayerWeights& w, Tensor latent,
                         const QueryPath& query, std::unique_ptr<CoreSaved>& saved) const = 0;
  // The core's backward: dout [T, B, Hr, Dv] -> dlatent [N, B, Dl] (returned); g.wkv_b (+=),
  // partial over this rank's tokens or head shard. Consumes saved. dq_local [N, B, H, Dqk] goes to
  // `query_backward` (the block's query-path backward: RoPE's transpose, L3, L2 and L1's weight
  // gradient, none of which needs dlatent), which the form calls exactly once, with what it can
  // issue before it in flight (laga: the dlatent reduce-scatter; explicit: dk's and dv's
  // all-to-alls).
  virtual Tensor backward(const RankCtx& ctx, const LayerWeights& w,
                          std::unique_ptr<CoreSaved> saved, Tensor dout, LayerWeights& g,
                          const QueryPathBackward& query_backward) const = 0;

  // Where the core's output lives. heads: o [T, B, Hr, Dv], this rank's heads over the whole
  // sequence (the head-scatter forms), and the block adds the o/do all-to-all pair (gather_heads /
  // its adjoint) around the core. tokens: o [N, B, H, Dv], this rank's tokens with all H heads (the
  // ring forms), and the block uses it as is (and hands the core dout [N, B, H, Dv]).
  enum class Output { heads, tokens };
  virtual Output output() const { return Output::heads; }
  // Which global tokens each rank holds under config c (token_segments).
  virtual TokenLayout layout(const MlaConfig& c) const { return TokenLayout::contiguous; }

  // True for the forms of DeepSeek Sparse Attention (docs/sparse.md): they run the lightning
  // indexer (the model must have one, ModelDims::has_indexer) and take --indexer-stage; every other
  // form ignores the indexer and its weights.
  virtual bool sparse() const { return false; }
  // What a sparse form's forward found for one layer, for the run's report and dumps: the indexer's
  // loss L_I (unscaled) and the selection [N, B, k] (int32 key positions, ascending, −1 padded).
  // Empty for a dense form.
  struct Sparse {
    double indexer_loss = 0;
    Tensor topk;
  };
  virtual Sparse sparse_of(const CoreSaved& saved) const { return {}; }
  // True when every rank runs the same shapes, so that one rank's plan stands for all (the model
  // plans rank 0 alone): the head-scatter forms. Not the ring forms (each rank its own chunks) nor
  // the sparse forms (a query's causal keys, and so the indexer's work, grow with its position).
  virtual bool ranks_alike(const MlaConfig& c) const {
    return layout(c) == TokenLayout::contiguous && !sparse();
  }
  // A sparse form that at P = 1 runs another sparse form's operations exactly (dsa-regather:
  // dsa-gather's; a gather of one rank is a copy) names it: their results must then be
  // bit-identical. Empty otherwise.
  virtual std::string_view bitwise_at_one_rank_with() const { return {}; }
  // True when at P = 1 the form runs explicit's operations exactly (its collectives are
  // identities): its results must then be bit-identical to explicit's (laga and its variants).
  virtual bool exact_at_one_rank() const { return false; }
  // The attention kernel the form runs whatever the config's kernel says (laga-fused: "latent", its
  // own kernel with the up-projection inside; the ring forms: "fused", whose log-sum-exp merges the
  // chunk partials); empty for the forms that run the config's kernel. Commands print it where they
  // print the kernel when it differs from the config's, so the config's kernel is never silently
  // ignored.
  virtual std::string_view own_kernel() const { return {}; }
  // --ulysses Pu (RunShape::ulysses): a form that runs another's head scatter in groups of Pu ranks
  // × a ring over the P/Pu groups (laga-ulysses: laga's) names that form here. It takes --ulysses
  // (default_ulysses where none is given: resolved), and that form spelled with a --ulysses other
  // than --sp names it (resolve_form_label, resolved). Empty for every other form: those run over
  // the whole group and take no --ulysses (as_form gives them 0).
  virtual std::string_view ulysses_of() const { return {}; }
  bool takes_ulysses() const { return !ulysses_of().empty(); }
  // A form that takes --ulysses: its Pu for c where none is given (0 where c's P or H is not
  // positive).
  virtual int64_t default_ulysses(const MlaConfig& c) const { return 0; }
  // Configurations this form cannot run, as messages naming the value and a valid alternative. By
  // default the head-scatter forms' own condition: P divides H (add_head_scatter_problems).
  virtual void add_problems(const MlaConfig& c, std::vector<std::string>& problems) const {
    add_head_scatter_problems(c, problems);
  }
  // A form that scatters heads (Output::heads) needs P | H.
  static void add_head_scatter_problems(const MlaConfig& c, std::vector<std::string>& problems);
};

// Every registered form, in registry order (explicit first: the baseline every other is compared
// to).
const std::vector<const Form*>& registered_forms();
// The form every other is checked and timed against.
inline constexpr std::string_view kBaselineForm = "explicit";
const Form* find_form_or_null(std::string_view name);
const Form& find_form(std::string_view name);  // usage error naming the valid labels
// The form that runs config c: find_form(c.form).
const Form& form_of(const MlaConfig& c);
// c as Config takes it: its form's spelling resolved with c's --ulysses and --sp as
// resolve_form_label resolves it (laga with --ulysses 2 at --sp 8 is laga-ulysses), and a form that
// takes --ulysses (Form::takes_ulysses) given its default_ulysses where c has none (0). Config
// applies it before it validates, as_form after it sets the form: every config that runs names its
// form by its label, with its Pu.
MlaConfig resolved(MlaConfig c);
// c with form `name` (a registered label): --ulysses (Pu) kept, or defaulted, for a form that takes
// it, 0 for every other (those run over the whole group). The one way the commands that run every
// form derive a form's config.
MlaConfig as_form(MlaConfig c, std::string_view name);
// How commands name c's form: its label, with its Pu for a form that takes --ulysses
// ("laga-ulysses (ulysses 8)").
std::string displayed_form(const MlaConfig& c);
// The attention kernel f runs instead of kernel k: its own_kernel() where that is not k; empty
// where f runs k. Commands print it beside the kernel.
std::string_view kernel_instead(const Form& f, Kernel k);
// The labels of the forms that take --ulysses ("laga-ulysses"), for messages.
std::string ulysses_form_names();
// "explicit, absorbed-expanded, absorbed-shared, laga, ..."
std::string form_names();
// The one rule of the commands that run every form (plan, verify): a config whose problems lie
// apart from any form (problems_apart_from_form) is refused as a whole (usage error); a form whose
// own conditions fail is "not run", with its first reason, and the command goes on with the others.
// A config that no form can run is refused, naming each form's reason. Each form is judged on
// as_form(c, its name): --ulysses is laga-ulysses's, the others run over the whole group.
struct FormRefusal {
  const Form* form;
  std::string reason;
};
struct FormsAt {
  std::vector<const Form*> runnable;  // registry order
  std::vector<FormRefusal> refused;   // registry order
  // The reason f is not run, or empty when it is runnable.
  std::string refusal(const Form& f) const;
};
FormsAt forms_at(const MlaConfig& c);
// forms_at without its last refusal: every form judged, none runnable allowed.
FormsAt judge_forms(const MlaConfig& c);
// The label a user's spelling names (--form, --forms, a configuration's "form"): a registered
// label as is; a family with variants ("absorbed") with its regime appended ("absorbed-shared");
// and a form that takes no --ulysses, spelled with a --ulysses other than --sp (shape's ulysses and
// sp), the form that runs its head scatter in groups (Form::ulysses_of: laga with --ulysses 2 at
// --sp 8 names laga-ulysses; with --ulysses 8 it is laga). The one place a spelling becomes a
// label. Usage error naming the valid spellings otherwise.
std::string resolve_form_label(std::string_view form, std::string_view regime,
                               const RunShape& shape = {});

}  // namespace laga
