// Pieces shared by the laga subcommands: the common flags, the configuration they build, output
// files opened before any work, and running a function on every rank of a group under either
// backend (threads in-process, or this MPI process's rank under mpirun).
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "laga/comm/communicator.hpp"
#include "laga/mla/config.hpp"
#include "laga/mla/form.hpp"
#include "laga/driver/launch.hpp"
#include "laga/driver/plan.hpp"
#include "laga/mla/form.hpp"
#include "laga/driver/run.hpp"

namespace laga::cli {

// --mpi-progress's help: shared by the commands that communicate and bench-comm.
inline constexpr const char* kMpiProgressHelp =
    "under MPI, microseconds between the progress calls a rank makes from inside its compute, so a "
    "collective in flight moves behind it (0: only inside MPI calls; docs/design.md)";

// The link for a benchmark's header and JSON: scripts/link.sh's description (LAGA_LINK) or the
// launch's (threads, MPI processes, a host process's group), and under MPI how ranks progress
// collectives in flight (--mpi-progress).
std::string link_description(LaunchKind kind);

struct CommonFlags {
  std::string model = "tiny";
  int64_t seq = 0, sp = 1, batch = 1, layers = 1, ulysses = 0;
  std::string form = "explicit", kernel = "fused", absorbed_kv = "expanded", dtype = "bf16";
  std::string dlatent_sum{dlatent_sum_name(RunChoices{}.dlatent_sum)};
  std::string attn_backward{attn_backward_name(RunChoices{}.attn_backward)};
  std::string rope_layout = "interleaved", comm = "auto", json_path, config_path, overlap = "off";
  double timeout_s = 0;
  double mpi_progress_us = 500;  // set_mpi_progress_interval
  bool check_finite = false;
  bool attention_only = false;  // set: the attention alone (MlaConfig::attention_only)
  uint64_t seed = 1234;
  // The lightning indexer's dimensions (none: the model's), the sparse forms' stage and loss scale
  // (none: the defaults)
  std::optional<int64_t> index_heads, index_dim, index_topk;
  std::string indexer_stage, cp_layout;
  std::optional<double> indexer_loss_scale;
};

// --model --config --seq --batch --layers --kernel --absorbed-kv --dtype --dlatent-sum
// --rope-layout --overlap --attention-only --index-heads --index-dim --index-topk --indexer-stage
// --indexer-loss-scale --cp-layout --json --seed; with_comm adds --comm, --timeout and
// --mpi-progress.
void add_common(CLI::App* app, CommonFlags& f, bool with_comm);
Config build_config(const CommonFlags& f);
// The flags' configuration, not yet validated (for the commands that run every form: forms_at).
MlaConfig build_spec(const CommonFlags& f);
// The flags' configuration for a command that runs every form (plan, model): refused as a whole
// only for problems apart from any form; *at says which forms run it (forms_at). Each form's own
// config is config_as(spec, its name).
MlaConfig spec_for_all_forms(const CommonFlags& f, FormsAt& at);
// A --ulysses given to a command that runs every form (plan, model: one spec; verify: one per
// --sp) sets the Pu of the forms that take it (laga-ulysses, as_form): refused (usage error) where
// none of them runs it at any of the specs, naming each reason. Nothing to check without one.
void check_ulysses_runs(const std::vector<MlaConfig>& specs);
// The validated config of spec as form `name` (as_form: --ulysses stays laga-ulysses's alone).
Config config_as(const MlaConfig& spec, std::string_view name);
// The config of a form a command names (bench --forms, train --forms): config_as(spec, label), by
// the rule of the commands that run every form (forms_at): a problem apart from any form is refused
// as a whole; a named form that cannot run spec is refused (usage error) naming `flag`, the form,
// its reason and the forms that can run it.
Config named_form_config(const MlaConfig& spec, const std::string& label, const char* flag);
// " (laga-ulysses: Pu × Pr, --ulysses Pu)" after P in a command's header when --ulysses Pu < P is
// given; "".
std::string ulysses_note(const MlaConfig& c);
// " (attention only)" after the model's name in a command's header when the config runs the
// attention alone (MlaConfig::attention_only); "".
std::string attention_only_note(const MlaConfig& c);
// The registered form label a user's form spelling names with f's --absorbed-kv, --ulysses and --sp
// (resolve_form_label: absorbed and its regime, laga with a --ulysses other than --sp as
// laga-ulysses); usage error naming the valid spellings.
std::string form_label(const std::string& form, const CommonFlags& f);

// bench --inject-wrong FORM:ULPS (testing the validation): FORM's full-size y gets one element
// shifted by ULPS × eps(dtype) × max|y| before the validation sees it. Usage error unless FORM is
// one of `forms` (registered labels; FORM resolved as form_label does) and ULPS a positive number.
struct InjectWrong {
  std::string form;
  double ulps = 0;
};
InjectWrong parse_inject_wrong(const std::string& spec, const std::vector<std::string>& forms,
                               const CommonFlags& f);

// Opens (so checks) an output file before any work; null when path is empty.
std::unique_ptr<std::ofstream> open_output(const std::string& path, const char* flag);

std::string human_bytes(int64_t b);
// A rank's measured figures beside the planner's (planned_activation_peak_bytes,
// planned_saved_bytes).
nlohmann::json rank_json(const RankResult& r, const PlannedMemory& plan);

// Usage error when `ranks` ranks of this plan (baseline + activation peak each) exceed limit_bytes;
// the message gives the planned figure and where the limit came from.
void check_mem_limit(const PlannedMemory& plan, int64_t ranks, int64_t limit_bytes,
                     const std::string& limit_source);
// MPI ranks on this node (OMPI_COMM_WORLD_LOCAL_SIZE), 1 when unknown.
int64_t local_ranks();
// The memory one process may hold: --mem-limit's value when given (mem_limit non-empty), else the
// available memory, shared among this node's ranks when they are processes (mpirun). source names
// it for a refusal: "--mem-limit 16GiB" or "available memory".
struct MemLimit {
  int64_t bytes = 0;
  std::string source;
};
MemLimit mem_limit_of(const std::string& mem_limit, bool ranks_are_processes);
nlohmann::json collectives_json(const std::vector<CollectiveRecord>& records);

// Every rank's JSON on every rank, in rank order (variable-length all-gather).
std::vector<nlohmann::json> gather_json(Communicator& comm, const nlohmann::json& mine);

}  // namespace laga::cli
