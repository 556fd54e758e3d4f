// Lossless training restarts (docs/cli.md §5, `laga train --checkpoint DIR --checkpoint-every N`
// and
// `--resume DIR`): the whole state of a training run on disk, written atomically, read back
// strictly.
//
// Layout, one subdirectory per form (variant label), whatever the number of --forms:
//   DIR/<form>/latest                  the name of the newest complete checkpoint
//                                      ("step-00000012\n")
//   DIR/<form>/step-00000012/manifest.json
//   DIR/<form>/step-00000012/state.safetensors
// state.safetensors holds, for every weight W (laga names, "layers.{l}.<name>", for_each order),
// the fp32 master "master.W" and the Adam moments "adam_m.W", "adam_v.W", all F32 of shape [numel].
// The manifest (JSON) holds the format and version, the completed step count, the data stream's
// position (the next step and its data seed), the loss history (IEEE-754 bit patterns, so exact),
// the run's identity (the resolved config JSON, P, form, dtype, kernel, lr, betas, eps, seed),
// every file with its size and FNV-1a 64-bit checksum, and a checksum of the manifest itself.
//
// Atomicity: a checkpoint is written into DIR/<form>/.tmp-step-…, every file fsynced, the directory
// fsynced, then renamed to step-…; then latest.tmp is written, fsynced and renamed over latest, and
// the directory fsynced. Only then are older step-… directories removed, keeping the previous one.
// A crash (SIGKILL) at any moment leaves latest naming a complete checkpoint (or no latest at all).
//
// Reading refuses (usage error, exit 2, naming the file, the expected and the found value) a
// missing latest, a bad name, a truncated or corrupted file (size, checksum), a manifest that does
// not parse, and an identity other than the run's. Nothing is silently repaired or skipped.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace laga {

// FNV-1a, 64 bits, over bytes (continuing from h).
uint64_t fnv1a64(const void* data, size_t size, uint64_t h = 0xcbf29ce484222325ull);
std::string hash_hex(uint64_t h);  // 16 lowercase hex digits

struct TrainManifestFile {
  std::string name;
  uint64_t bytes = 0;
  uint64_t fnv1a64 = 0;
};

struct TrainManifest {
  int64_t step = 0;             // optimizer steps completed
  int64_t next_step = 0;        // the data stream's position (= step)
  uint64_t next_data_seed = 0;  // the seed of step next_step's inputs
  std::vector<double> losses;   // one per completed step
  nlohmann::json identity;      // an object
  std::vector<TrainManifestFile> files;
};

inline constexpr const char* kTrainCheckpointFormat = "laga-train-checkpoint";
inline constexpr int kTrainCheckpointVersion = 1;
inline constexpr int64_t kTrainManifestMaxBytes = 64 << 20;

// The manifest as JSON text (with its own checksum) and back. parse: usage error naming label and
// the offending key on any malformation; check_self_hash = false skips only the manifest's own
// checksum (fuzzing reaches the field checks). Round trip: parse(to_text(m)) == m.
std::string train_manifest_to_text(const TrainManifest& m);
TrainManifest parse_train_manifest(const std::string& text, const std::string& label,
                                   bool check_self_hash = true);

// The whole state of a run after `step` steps.
struct TrainState {
  TrainManifest manifest;
  std::vector<std::string> names;  // weight names, for_each order
  std::vector<std::vector<float>> master, m1, m2;
};

// DIR/<form>.
std::string train_checkpoint_dir(const std::string& dir, const std::string& form_label);
// "step-00000012".
std::string train_step_name(int64_t step);

// Writes state (manifest.files is filled in here) as the newest checkpoint of form_dir, by the
// protocol above. Usage error naming the path when a write fails.
void write_train_checkpoint(const std::string& form_dir, TrainState state);

// The newest checkpoint of form_dir, checked: files, sizes, checksums, the manifest, identity ==
// expected_identity (key by key), and the tensors names[i] with sizes[i] elements each.
TrainState read_train_checkpoint(const std::string& form_dir,
                                 const nlohmann::json& expected_identity,
                                 const std::vector<std::string>& names,
                                 const std::vector<int64_t>& sizes);

// Whether form_dir has a latest pointer (a checkpoint to resume from).
bool has_train_checkpoint(const std::string& form_dir);

}  // namespace laga
