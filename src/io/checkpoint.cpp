// Loading and writing weights by name, and the --dump of a run (names and policy at the top of
// io/checkpoint.hpp). A checkpoint is read through a name -> shard map, so a single file and a
// sharded Hugging Face checkpoint are the same thing here; shards open on first use.
#include "laga/io/checkpoint.hpp"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "laga/io/safetensors.hpp"

namespace laga {

namespace fs = std::filesystem;

namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";

// How a weight's expected shape follows from the config, for error messages.
std::string shape_reason(const MlaConfig& c, const std::string& name) {
  const WeightSpec* spec = find_weight_spec(name);
  LAGA_ASSERT(spec, "no weight named '{}'", name);
  return fmt::format(
      "{} with D = hidden_size {}, H = num_attention_heads {}, Lq = q_lora_rank {}, Lkv = "
      "kv_lora_rank "
      "{}, Dn = qk_nope_head_dim {}, Dr = qk_rope_head_dim {}, Dv = v_head_dim {} (model '{}')",
      spec->shape_doc, c.hidden_size, c.num_attention_heads, c.q_lora_rank, c.kv_lora_rank,
      c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.model);
}

std::string read_text_file(const std::string& path, int64_t limit) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  LAGA_CHECK(!ec, "{}: cannot read: {}", path, ec.message());
  LAGA_CHECK(int64_t(size) <= limit, "{}: {} bytes, more than the {} expected of it", path, size,
             limit);
  std::ifstream in(path, std::ios::binary);
  LAGA_CHECK(in, "{}: cannot open for reading: {}", path, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_text_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  LAGA_CHECK(f, "{}: cannot open for writing: {}; choose a writable directory", path,
             std::strerror(errno));
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  const bool closed = std::fclose(f) == 0;
  LAGA_CHECK(wrote && closed, "{}: write failed: {}", path, std::strerror(wrote ? errno : err));
}

// Every tensor name of a checkpoint, with the shard that holds it.
class CheckpointSource {
 public:
  explicit CheckpointSource(const std::string& path) : path_(path) {
    std::error_code ec;
    std::string file = path;
    if (fs::is_directory(path, ec)) {
      const fs::path index = fs::path(path) / kIndexName, single = fs::path(path) / kSingleName;
      if (fs::exists(index, ec))
        file = index.string();
      else if (fs::exists(single, ec))
        file = single.string();
      else
        LAGA_FAIL_USAGE("{}: a directory with neither {} nor {}; give a .safetensors file", path,
                        kIndexName, kSingleName);
    }
    if (file.size() >= 5 && file.compare(file.size() - 5, 5, ".json") == 0) {
      read_index(file);
    } else {
      SafetensorsFile& s = shards_.emplace(file, SafetensorsFile::open(file)).first->second;
      for (const auto& name : s.names()) shard_of_[name] = file;
    }
  }

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return shard_of_.count(name) != 0; }

  const SafetensorsFile& shard(const std::string& name) {
    const std::string& file = shard_of_.at(name);
    auto it = shards_.find(file);
    if (it == shards_.end()) it = shards_.emplace(file, SafetensorsFile::open(file)).first;
    return it->second;
  }

  std::string some_names() const {
    std::string s;
    int shown = 0;
    for (const auto& [name, file] : shard_of_) {
      if (shown == 6) break;
      s += (shown++ ? ", " : "") + name;
    }
    if (shard_of_.size() > 6) s += fmt::format(", ... ({} in all)", shard_of_.size());
    return shard_of_.empty() ? "no tensors" : s;
  }

 private:
  void read_index(const std::string& file) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text_file(file, kSafetensorsMaxHeaderBytes));
    } catch (const nlohmann::json::exception& e) {
      LAGA_FAIL_USAGE("{}: not valid JSON ({})", file, e.what());
    }
    LAGA_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
               "{}: not a safetensors index: expected an object with a 'weight_map' object", file);
    const fs::path dir = fs::path(file).parent_path();
    for (const auto& [name, shard] : j["weight_map"].items()) {
      LAGA_CHECK(shard.is_string(), "{}: weight_map['{}'] is a JSON {}, not a file name", file,
                 name, shard.type_name());
      shard_of_[name] = (dir / shard.get<std::string>()).string();
    }
  }

  std::string path_;
  std::map<std::string, std::string> shard_of_;
  std::map<std::string, SafetensorsFile> shards_;
};

// The number of consecutive layers from 0 whose wkv_a (every model's, attention_only or not) the
// checkpoint holds.
int64_t layers_present(const CheckpointSource& src, WeightNaming naming) {
  int64_t l = 0;
  while (src.has(checkpoint_name(naming, l, "wkv_a"))) ++l;
  return l;
}

std::string missing_hint(const CheckpointSource& src, WeightNaming naming, const MlaConfig& c,
                         int64_t l, const std::string& name) {
  const int64_t present = layers_present(src, naming);
  if (l >= present && present > 0)
    return fmt::format("; the file holds layers 0..{}, so try --layers {} (or fewer)", present - 1,
                       present);
  const bool want_lora = name == "wq_a" || name == "q_norm" || name == "wq_b";
  if (want_lora && src.has(checkpoint_name(naming, l, "wq")))
    return fmt::format(
        "; the file has {} instead, a checkpoint with q_lora_rank = 0 (like deepseek-v2-lite), but "
        "this config has q_lora_rank {}",
        checkpoint_name(naming, l, "wq"), c.q_lora_rank);
  if (name == "wq" && src.has(checkpoint_name(naming, l, "wq_a")))
    return fmt::format(
        "; the file has {} instead, a checkpoint with q_lora_rank > 0, but this config has "
        "q_lora_rank 0",
        checkpoint_name(naming, l, "wq_a"));
  if (name == "attn_norm" && src.has(checkpoint_name(naming, l, "wkv_a")))
    return "; the file holds the attention alone, without the input norm (a dump of "
           "--attention-only): add --attention-only";
  return "";
}

}  // namespace

std::string_view weight_naming_name(WeightNaming n) {
  return n == WeightNaming::laga ? "laga" : "hugging-face";
}

std::string checkpoint_name(WeightNaming naming, int64_t layer, const std::string& name) {
  if (naming == WeightNaming::laga) return fmt::format("layers.{}.{}", layer, name);
  const WeightSpec* spec = find_weight_spec(name);
  LAGA_ASSERT(spec, "no weight named '{}'", name);
  return fmt::format("model.layers.{}.{}", layer, spec->hf_key);
}

Weights load_weights(const std::string& path, const Config& cfg) {
  const MlaConfig& c = *cfg;
  CheckpointSource src(path);
  WeightNaming naming;
  // attn_norm or wkv_a: a model with attention_only has no attn_norm
  if (src.has(checkpoint_name(WeightNaming::laga, 0, "attn_norm")) ||
      src.has(checkpoint_name(WeightNaming::laga, 0, "wkv_a")))
    naming = WeightNaming::laga;
  else if (src.has(checkpoint_name(WeightNaming::hugging_face, 0, "attn_norm")) ||
           src.has(checkpoint_name(WeightNaming::hugging_face, 0, "wkv_a")))
    naming = WeightNaming::hugging_face;
  else
    LAGA_FAIL_USAGE(
        "{}: holds neither laga weights ({}) nor Hugging Face DeepSeek weights ({}); it holds {}",
        path, checkpoint_name(WeightNaming::laga, 0, "attn_norm"),
        checkpoint_name(WeightNaming::hugging_face, 0, "wkv_a"), src.some_names());

  // Every name and shape is checked before anything is read, so a bad file fails fast.
  const auto shapes = layer_weight_shapes(c);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (const auto& [name, expected] : shapes) {
      const std::string file_name = checkpoint_name(naming, l, name);
      LAGA_CHECK(src.has(file_name), "{}: no tensor {} ({} weights, layer {}){}", path, file_name,
                 weight_naming_name(naming), l, missing_hint(src, naming, c, l, name));
      const SafetensorsFile& shard = src.shard(file_name);
      const Shape& got = shard.entry(file_name).shape;
      LAGA_CHECK(got == expected, "{}: {} has shape {}; expected {} = {}", shard.path(), file_name,
                 shape_str(got), shape_str(expected), shape_reason(c, name));
    }
  }
  Weights w;
  w.layers.resize(size_t(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (const auto& [name, expected] : shapes) {
      const std::string file_name = checkpoint_name(naming, l, name);
      w.layers[size_t(l)].by_name(name) = src.shard(file_name).load(file_name, c.dtype, "weights");
    }
  return w;
}

void write_weights(const std::string& path, const MlaConfig& c, const Weights& w,
                   WeightNaming naming) {
  LAGA_CHECK(int64_t(w.layers.size()) == c.num_layers, "{}: {} layers of weights for num_layers {}",
             path, w.layers.size(), c.num_layers);
  std::vector<std::string> names;
  std::vector<const Tensor*> tensors;
  for (size_t l = 0; l < w.layers.size(); ++l)
    w.layers[l].for_each([&](const std::string& name, const Tensor& t) {
      names.push_back(checkpoint_name(naming, int64_t(l), name));
      tensors.push_back(&t);
    });
  std::vector<std::pair<std::string, const Tensor*>> list;
  for (size_t i = 0; i < names.size(); ++i) list.emplace_back(names[i], tensors[i]);
  write_safetensors(path, list, {{"format", "pt"}, {"producer", "laga"}});
}

void check_writable_dir(const std::string& dir) {
  LAGA_CHECK(!dir.empty(), "empty directory name; give a writable directory");
  std::error_code ec;
  if (fs::exists(dir, ec))
    LAGA_CHECK(fs::is_directory(dir, ec), "'{}' exists and is not a directory; choose a directory",
               dir);
  fs::create_directories(dir, ec);
  LAGA_CHECK(!ec, "cannot create directory '{}': {}; choose a writable directory", dir,
             ec.message());
  const std::string probe =
      (fs::path(dir) / fmt::format(".laga-write-probe-{}", ::getpid())).string();
  std::FILE* f = std::fopen(probe.c_str(), "wb");
  LAGA_CHECK(f, "cannot write in directory '{}': {}; choose a writable directory", dir,
             std::strerror(errno));
  const bool ok = std::fputs("probe\n", f) >= 0;
  const bool closed = std::fclose(f) == 0;
  fs::remove(probe, ec);
  LAGA_CHECK(ok && closed,
             "cannot write in directory '{}' (is the disk full?); choose a writable directory",
             dir);
}

void write_dump(const std::string& dir, const MlaConfig& c, const Tensor& x, const Tensor& dy,
                const Tensor& y, const Tensor& dx, const Weights& w, const Weights& grads,
                const std::vector<Tensor>& topk) {
  check_writable_dir(dir);
  const Shape act{c.seq_len, c.batch, c.hidden_size};
  check_shape(x, act, "x");
  check_shape(dy, act, "dy");
  check_shape(y, act, "y");
  check_shape(dx, act, "dx");
  LAGA_CHECK(
      int64_t(w.layers.size()) == c.num_layers && int64_t(grads.layers.size()) == c.num_layers,
      "dump: {} layers of weights and {} of gradients for num_layers {}", w.layers.size(),
      grads.layers.size(), c.num_layers);
  const auto shapes = layer_weight_shapes(c);

  std::vector<std::string> names{"x", "dy", "y", "dx"};
  std::vector<const Tensor*> tensors{&x, &dy, &y, &dx};
  for (const auto* set : {&w, &grads}) {
    const char* suffix = set == &w ? "" : ".grad";
    for (size_t l = 0; l < set->layers.size(); ++l) {
      for (const auto& [name, shape] : shapes) {
        const std::string full = checkpoint_name(WeightNaming::laga, int64_t(l), name) + suffix;
        const Tensor* t = &set->layers[l].by_name(name);
        check_shape(*t, shape, full.c_str());
        names.push_back(full);
        tensors.push_back(t);
      }
    }
  }
  LAGA_CHECK(topk.empty() || int64_t(topk.size()) == c.num_layers,
             "dump: {} layers of selections for num_layers {}", topk.size(), c.num_layers);
  for (size_t l = 0; l < topk.size(); ++l) {
    const std::string full = fmt::format("layers.{}.topk", l);
    check_shape(topk[l], {c.seq_len, c.batch, c.topk()}, full.c_str());
    check_dtype(topk[l], DType::i32, full.c_str());
    names.push_back(full);
    tensors.push_back(&topk[l]);
  }
  std::vector<std::pair<std::string, const Tensor*>> list;
  for (size_t i = 0; i < names.size(); ++i) list.emplace_back(names[i], tensors[i]);

  write_text_file((fs::path(dir) / "config.json").string(), c.to_json().dump(2) + "\n");
  write_safetensors(
      (fs::path(dir) / "tensors.safetensors").string(), list,
      {{"format", "pt"}, {"producer", "laga"}, {"dtype", std::string(dtype_name(c.dtype))}},
      DType::f32);
}

}  // namespace laga
