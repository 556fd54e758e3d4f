// Training checkpoints: layout, manifest and atomicity protocol at the top of
// io/train_checkpoint.hpp.
#include "laga/io/train_checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "laga/core/error.hpp"
#include "laga/io/safetensors.hpp"

namespace laga {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifestName = "manifest.json";
constexpr const char* kStateName = "state.safetensors";
constexpr const char* kLatestName = "latest";
constexpr const char* kSelfHashKey = "manifest_fnv1a64";
const char* const kStateKinds[] = {"master", "adam_m", "adam_v"};

uint64_t parse_hex64(const nlohmann::json& v, const std::string& label, const std::string& key) {
  LAGA_CHECK(v.is_string(), "{}: '{}' is a JSON {}; expected a string of 16 hex digits", label, key,
             v.type_name());
  const std::string s = v.get<std::string>();
  LAGA_CHECK(s.size() == 16, "{}: '{}' is '{}'; expected 16 hex digits", label, key,
             s.substr(0, 40));
  uint64_t h = 0;
  for (char ch : s) {
    int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    LAGA_CHECK(d >= 0, "{}: '{}' is '{}'; expected lowercase hex digits", label, key, s);
    h = h << 4 | uint64_t(d);
  }
  return h;
}

const nlohmann::json& field(const nlohmann::json& j, const char* key, const std::string& label) {
  LAGA_CHECK(j.contains(key), "{}: no '{}'; not a complete laga training checkpoint manifest",
             label, key);
  return j[key];
}

int64_t nonneg_int(const nlohmann::json& v, const std::string& label, const std::string& key) {
  LAGA_CHECK(v.is_number_integer(), "{}: '{}' is a JSON {}; expected an integer ≥ 0", label, key,
             v.type_name());
  LAGA_CHECK(v.is_number_unsigned() || v.get<int64_t>() >= 0,
             "{}: '{}' is {}; expected an integer ≥ 0", label, key, v.dump());
  LAGA_CHECK(v.get<uint64_t>() <= uint64_t(INT64_MAX), "{}: '{}' is {}; too large", label, key,
             v.dump());
  return int64_t(v.get<uint64_t>());
}

uint64_t self_hash(nlohmann::json j) {
  j.erase(kSelfHashKey);
  const std::string text = j.dump();
  return fnv1a64(text.data(), text.size());
}

std::string read_file(const std::string& path, int64_t limit, const char* what) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  LAGA_CHECK(!ec, "{}: cannot read the checkpoint's {}: {}", path, what, ec.message());
  LAGA_CHECK(int64_t(size) <= limit, "{}: {} bytes, more than the {} a checkpoint's {} may have",
             path, size, limit, what);
  std::ifstream in(path, std::ios::binary);
  LAGA_CHECK(in, "{}: cannot open the checkpoint's {}: {}", path, what, std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  LAGA_CHECK(fd >= 0, "{}: cannot open to sync: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  LAGA_CHECK(rc == 0, "{}: fsync failed: {}", path, std::strerror(err));
}

// Writes bytes to path (created or truncated) and fsyncs it.
void write_durable(const std::string& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LAGA_CHECK(fd >= 0, "{}: cannot open for writing: {}; choose a writable --checkpoint directory",
             path, std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      LAGA_FAIL_USAGE("{}: write failed: {} (is the disk full?)", path, std::strerror(err));
    }
    done += size_t(n);
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  const int closed = ::close(fd);
  LAGA_CHECK(rc == 0 && closed == 0, "{}: fsync/close failed: {}", path,
             std::strerror(rc ? err : errno));
}

std::string state_bytes(const TrainState& s) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", kTrainCheckpointFormat}, {"producer", "laga"}};
  int64_t offset = 0;
  for (size_t k = 0; k < 3; ++k) {
    const auto& set = k == 0 ? s.master : k == 1 ? s.m1 : s.m2;
    for (size_t i = 0; i < s.names.size(); ++i) {
      const int64_t n = int64_t(set[i].size()) * 4;
      header[fmt::format("{}.{}", kStateKinds[k], s.names[i])] = {
          {"dtype", "F32"},
          {"shape", {int64_t(set[i].size())}},
          {"data_offsets", {offset, offset + n}}};
      offset += n;
    }
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  const uint64_t len = text.size();
  for (int b = 0; b < 8; ++b) out[size_t(b)] = char((len >> (8 * b)) & 0xff);
  out += text;
  out.reserve(out.size() + size_t(offset));
  for (size_t k = 0; k < 3; ++k) {
    const auto& set = k == 0 ? s.master : k == 1 ? s.m1 : s.m2;
    for (const auto& v : set) out.append(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  return out;
}

// The first difference between two identities, as "key: expected X, found Y"; "" when equal.
std::string identity_difference(const nlohmann::json& want, const nlohmann::json& got,
                                const std::string& path) {
  if (want.is_object() && got.is_object()) {
    for (const auto& [k, v] : want.items()) {
      const std::string p = path.empty() ? k : path + "." + k;
      if (!got.contains(k)) return fmt::format("{}: expected {}, found nothing", p, v.dump());
      std::string d = identity_difference(v, got[k], p);
      if (!d.empty()) return d;
    }
    for (const auto& [k, v] : got.items())
      if (!want.contains(k))
        return fmt::format("{}: expected nothing, found {}", path.empty() ? k : path + "." + k,
                           v.dump());
    return "";
  }
  if (want != got) return fmt::format("{}: expected {}, found {}", path, want.dump(), got.dump());
  return "";
}

bool valid_step_name(const std::string& s) {
  if (s.size() != 13 || s.compare(0, 5, "step-") != 0) return false;
  for (size_t i = 5; i < s.size(); ++i)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

std::vector<fs::path> entries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path());
  return out;
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t size, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::string hash_hex(uint64_t h) { return fmt::format("{:016x}", h); }

std::string train_manifest_to_text(const TrainManifest& m) {
  nlohmann::json j;
  j["format"] = kTrainCheckpointFormat;
  j["version"] = kTrainCheckpointVersion;
  j["step"] = m.step;
  j["data"] = {{"next_step", m.next_step}, {"next_seed", m.next_data_seed}};
  nlohmann::json bits = nlohmann::json::array();
  for (double l : m.losses) {
    uint64_t b;
    std::memcpy(&b, &l, 8);
    bits.push_back(hash_hex(b));
  }
  j["loss_bits"] = bits;
  j["identity"] = m.identity;
  nlohmann::json files = nlohmann::json::array();
  for (const auto& f : m.files)
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"fnv1a64", hash_hex(f.fnv1a64)}});
  j["files"] = files;
  j[kSelfHashKey] = hash_hex(self_hash(j));
  return j.dump(1) + "\n";
}

TrainManifest parse_train_manifest(const std::string& text, const std::string& label,
                                   bool check_self_hash) {
  LAGA_CHECK(int64_t(text.size()) <= kTrainManifestMaxBytes,
             "{}: {} bytes, more than a manifest may have ({})", label, text.size(),
             kTrainManifestMaxBytes);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  LAGA_CHECK(!j.is_discarded(), "{}: not valid JSON (truncated or corrupted manifest)", label);
  LAGA_CHECK(j.is_object(), "{}: a JSON {}, not a manifest object", label, j.type_name());
  const uint64_t stored = parse_hex64(field(j, kSelfHashKey, label), label, kSelfHashKey);
  if (check_self_hash) {
    const uint64_t found = self_hash(j);
    LAGA_CHECK(stored == found,
               "{}: manifest checksum {} but its contents hash to {} (corrupted manifest)", label,
               hash_hex(stored), hash_hex(found));
  }
  const auto& format = field(j, "format", label);
  LAGA_CHECK(format == kTrainCheckpointFormat, "{}: format {}; expected \"{}\"", label,
             format.dump(), kTrainCheckpointFormat);
  const auto& version = field(j, "version", label);
  LAGA_CHECK(version == kTrainCheckpointVersion, "{}: version {}; this laga reads version {}",
             label, version.dump(), kTrainCheckpointVersion);
  TrainManifest m;
  m.step = nonneg_int(field(j, "step", label), label, "step");
  const auto& data = field(j, "data", label);
  LAGA_CHECK(data.is_object(), "{}: 'data' is a JSON {}; expected an object", label,
             data.type_name());
  m.next_step = nonneg_int(field(data, "next_step", label), label, "data.next_step");
  const auto& seed = field(data, "next_seed", label);
  LAGA_CHECK(seed.is_number_unsigned(), "{}: 'data.next_seed' is {}; expected an integer ≥ 0",
             label, seed.dump());
  m.next_data_seed = seed.get<uint64_t>();
  LAGA_CHECK(m.next_step == m.step, "{}: data.next_step {} but step {}; expected equal", label,
             m.next_step, m.step);
  const auto& bits = field(j, "loss_bits", label);
  LAGA_CHECK(bits.is_array(), "{}: 'loss_bits' is a JSON {}; expected an array", label,
             bits.type_name());
  LAGA_CHECK(int64_t(bits.size()) == m.step, "{}: {} losses for step {}; expected one per step",
             label, bits.size(), m.step);
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint64_t b = parse_hex64(bits[i], label, fmt::format("loss_bits[{}]", i));
    double l;
    std::memcpy(&l, &b, 8);
    m.losses.push_back(l);
  }
  m.identity = field(j, "identity", label);
  LAGA_CHECK(m.identity.is_object(), "{}: 'identity' is a JSON {}; expected an object", label,
             m.identity.type_name());
  const auto& files = field(j, "files", label);
  LAGA_CHECK(files.is_array(), "{}: 'files' is a JSON {}; expected an array", label,
             files.type_name());
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& f = files[i];
    const std::string key = fmt::format("files[{}]", i);
    LAGA_CHECK(f.is_object(), "{}: '{}' is a JSON {}; expected an object", label, key,
               f.type_name());
    TrainManifestFile e;
    const auto& name = field(f, "name", label);
    LAGA_CHECK(name.is_string(), "{}: '{}.name' is a JSON {}; expected a string", label, key,
               name.type_name());
    e.name = name.get<std::string>();
    LAGA_CHECK(e.name == kStateName, "{}: '{}.name' is '{}'; expected {}", label, key,
               e.name.substr(0, 80), kStateName);
    for (const auto& other : m.files)
      LAGA_CHECK(other.name != e.name, "{}: '{}' listed twice", label, e.name);
    e.bytes = uint64_t(nonneg_int(field(f, "bytes", label), label, key + ".bytes"));
    e.fnv1a64 = parse_hex64(field(f, "fnv1a64", label), label, key + ".fnv1a64");
    m.files.push_back(e);
  }
  LAGA_CHECK(m.files.size() == 1, "{}: {} files listed; expected {} only", label, m.files.size(),
             kStateName);
  return m;
}

std::string train_checkpoint_dir(const std::string& dir, const std::string& form_label) {
  return (fs::path(dir) / form_label).string();
}

std::string train_step_name(int64_t step) { return fmt::format("step-{:08d}", step); }

bool has_train_checkpoint(const std::string& form_dir) {
  std::error_code ec;
  return fs::exists(fs::path(form_dir) / kLatestName, ec);
}

void write_train_checkpoint(const std::string& form_dir, TrainState state) {
  std::error_code ec;
  const fs::path dir(form_dir);
  fs::create_directories(dir, ec);
  LAGA_CHECK(!ec, "cannot create checkpoint directory '{}': {}", form_dir, ec.message());
  // The form's directory entry itself survives a power loss too.
  fsync_path(dir.has_parent_path() ? dir.parent_path().string() : ".", true);
  // What latest names now: kept until the new one is in place, and kept after as the previous one.
  std::string previous;
  if (fs::exists(dir / kLatestName, ec)) {
    std::ifstream in(dir / kLatestName);
    std::getline(in, previous);
  }
  const std::string name = train_step_name(state.manifest.step);
  // Only a resumed run that was already complete gets here (cmd_train refuses to overwrite another
  // run's checkpoints): the same step, the same bytes.
  if (previous == name) return;
  // Leftovers of a writer killed earlier: unfinished temporaries, and a step directory latest never
  // named.
  for (const auto& e : entries(dir)) {
    const std::string n = e.filename().string();
    if (n.rfind(".tmp-", 0) == 0 || n == name) fs::remove_all(e, ec);
  }
  const fs::path tmp = dir / fmt::format(".tmp-{}-{}", name, ::getpid());
  fs::create_directory(tmp, ec);
  LAGA_CHECK(!ec, "cannot create '{}': {}; choose a writable --checkpoint directory", tmp.string(),
             ec.message());

  const std::string bytes = state_bytes(state);
  write_durable((tmp / kStateName).string(), bytes);
  state.manifest.files = {
      {kStateName, uint64_t(bytes.size()), fnv1a64(bytes.data(), bytes.size())}};
  write_durable((tmp / kManifestName).string(), train_manifest_to_text(state.manifest));
  fsync_path(tmp.string(), true);
  fs::rename(tmp, dir / name, ec);
  LAGA_CHECK(!ec, "cannot rename '{}' to '{}': {}", tmp.string(), (dir / name).string(),
             ec.message());
  fsync_path(dir.string(), true);
  write_durable((dir / "latest.tmp").string(), name + "\n");
  fs::rename(dir / "latest.tmp", dir / kLatestName, ec);
  LAGA_CHECK(!ec, "cannot rename '{}' over '{}': {}", (dir / "latest.tmp").string(),
             (dir / kLatestName).string(), ec.message());
  fsync_path(dir.string(), true);
  // Now older checkpoints may go: keep the new one and the previous one.
  for (const auto& e : entries(dir)) {
    const std::string n = e.filename().string();
    if (valid_step_name(n) && n != name && n != previous) fs::remove_all(e, ec);
  }
}

TrainState read_train_checkpoint(const std::string& form_dir,
                                 const nlohmann::json& expected_identity,
                                 const std::vector<std::string>& names,
                                 const std::vector<int64_t>& sizes) {
  const fs::path dir(form_dir);
  const std::string latest = (dir / kLatestName).string();
  std::error_code ec;
  LAGA_CHECK(fs::exists(latest, ec),
             "--resume: no checkpoint in '{}' (no file {}); start without --resume, or give the "
             "--checkpoint directory of an earlier run",
             form_dir, latest);
  std::string name = read_file(latest, 64, "latest pointer");
  if (!name.empty() && name.back() == '\n') name.pop_back();
  LAGA_CHECK(valid_step_name(name),
             "{}: names '{}'; expected a checkpoint name like step-00000012 (corrupted)", latest,
             name.substr(0, 40));
  const fs::path step_dir = dir / name;
  const std::string manifest_path = (step_dir / kManifestName).string();
  LAGA_CHECK(fs::exists(manifest_path, ec),
             "{}: names {}, but {} does not exist (checkpoint removed or damaged)", latest, name,
             manifest_path);
  TrainState s;
  s.manifest = parse_train_manifest(read_file(manifest_path, kTrainManifestMaxBytes, "manifest"),
                                    manifest_path);
  const TrainManifest& m = s.manifest;
  LAGA_CHECK(train_step_name(m.step) == name, "{}: step {} but the directory is {}; expected {}",
             manifest_path, m.step, name, train_step_name(m.step));
  const std::string diff = identity_difference(expected_identity, m.identity, "");
  LAGA_CHECK(
      diff.empty(),
      "{}: a checkpoint of another run: {}; resume with the flags of that run, or start afresh",
      manifest_path, diff);

  const TrainManifestFile& f = m.files.at(0);
  const std::string state_path = (step_dir / f.name).string();
  LAGA_CHECK(fs::exists(state_path, ec), "{}: missing; the manifest {} lists it", state_path,
             manifest_path);
  const std::string bytes = read_file(state_path, int64_t(f.bytes) + 1, "state");
  LAGA_CHECK(bytes.size() == f.bytes,
             "{}: {} bytes; expected {} from the manifest (truncated or replaced)", state_path,
             bytes.size(), f.bytes);
  const uint64_t h = fnv1a64(bytes.data(), bytes.size());
  LAGA_CHECK(h == f.fnv1a64, "{}: checksum fnv1a64 {}; expected {} from the manifest (corrupted)",
             state_path, hash_hex(h), hash_hex(f.fnv1a64));
  const SafetensorsFile st = SafetensorsFile::from_bytes(bytes, state_path);
  uint64_t header_len = 0;
  for (int b = 0; b < 8; ++b) header_len |= uint64_t(uint8_t(bytes[size_t(b)])) << (8 * b);
  const size_t data_start = 8 + size_t(header_len);
  s.names = names;
  for (size_t k = 0; k < 3; ++k) {
    auto& set = k == 0 ? s.master : k == 1 ? s.m1 : s.m2;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string t = fmt::format("{}.{}", kStateKinds[k], names[i]);
      LAGA_CHECK(st.contains(t), "{}: no tensor {}; expected one per weight of this model",
                 state_path, t);
      const SafetensorsEntry& e = st.entry(t);
      LAGA_CHECK(e.dtype == "F32" && e.numel() == sizes[i],
                 "{}: {} is {} of {} elements; expected F32 of {}", state_path, t, e.dtype,
                 e.numel(), sizes[i]);
      set.emplace_back(size_t(sizes[i]));
      std::memcpy(set.back().data(), bytes.data() + data_start + size_t(e.begin),
                  size_t(e.nbytes()));
    }
  }
  return s;
}

}  // namespace laga
