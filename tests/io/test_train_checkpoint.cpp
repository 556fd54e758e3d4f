// Training checkpoints (io/train_checkpoint.hpp): the state reads back bit for bit; a new
// checkpoint replaces latest only once complete and keeps the previous one; leftovers of a killed
// writer are cleaned; the manifest round-trips and its checksum, sizes, file checksums and identity
// are enforced with usage errors naming the file and the expected and found values.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "laga/core/error.hpp"
#include "laga/io/train_checkpoint.hpp"
#include "support/temp_dir.hpp"

using namespace laga;
namespace fs = std::filesystem;

namespace {

class TrainCheckpoint : public ::testing::Test {
 protected:
  TrainState state(int64_t step) const {
    TrainState s;
    s.manifest.step = s.manifest.next_step = step;
    s.manifest.next_data_seed = 1000 + uint64_t(step);
    for (int64_t i = 0; i < step; ++i) s.manifest.losses.push_back(1.0 / double(i + 3));
    s.manifest.identity = identity_;
    s.names = {"layers.0.a", "layers.0.b"};
    for (auto* set : {&s.master, &s.m1, &s.m2}) {
      set->push_back({float(step), -0.0f, 1e-30f});
      set->push_back({3.5f});
    }
    return s;
  }
  std::string usage_error(const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::usage) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return "";
  }
  TrainState read(const nlohmann::json& id) const {
    return read_train_checkpoint(tmp_.dir().string(), id, {"layers.0.a", "layers.0.b"}, {3, 1});
  }

  laga::testing::TempDir tmp_{"train-ckpt"};
  nlohmann::json identity_ = {{"sp", 2}, {"form", "laga"}, {"lr", 1e-3}};
};

TEST_F(TrainCheckpoint, StateReadsBackBitForBit) {
  write_train_checkpoint(tmp_.dir().string(), state(4));
  const TrainState got = read(identity_);
  const TrainState want = state(4);
  EXPECT_EQ(got.manifest.step, 4);
  EXPECT_EQ(got.manifest.next_data_seed, 1004u);
  ASSERT_EQ(got.manifest.losses.size(), 4u);
  EXPECT_EQ(std::memcmp(got.manifest.losses.data(), want.manifest.losses.data(), 4 * 8), 0);
  // -0.0 and a denormal too
  EXPECT_EQ(std::memcmp(got.master[0].data(), want.master[0].data(), 12), 0);
  EXPECT_EQ(got.m2[1], want.m2[1]);
}

TEST_F(TrainCheckpoint, KeepsThePreviousCheckpointAndCleansLeftovers) {
  write_train_checkpoint(tmp_.dir().string(), state(2));
  fs::create_directories(tmp_.dir() / ".tmp-step-00000003-1");  // a writer killed mid-checkpoint
  // renamed, but latest never pointed at it
  fs::create_directories(tmp_.dir() / "step-00000003");
  write_train_checkpoint(tmp_.dir().string(), state(4));
  write_train_checkpoint(tmp_.dir().string(), state(6));
  EXPECT_FALSE(fs::exists(tmp_.dir() / ".tmp-step-00000003-1"));
  EXPECT_FALSE(fs::exists(tmp_.dir() / "step-00000003"));
  EXPECT_FALSE(fs::exists(tmp_.dir() / "step-00000002"));
  EXPECT_TRUE(fs::exists(tmp_.dir() / "step-00000004" / "state.safetensors"));
  EXPECT_TRUE(fs::exists(tmp_.dir() / "step-00000006" / "manifest.json"));
  EXPECT_EQ(read(identity_).manifest.step, 6);
}

TEST_F(TrainCheckpoint, RefusesAnotherRunNamingTheKeyAndBothValues) {
  write_train_checkpoint(tmp_.dir().string(), state(2));
  nlohmann::json other = identity_;
  other["sp"] = 4;
  const std::string e = usage_error([&] { read(other); });
  EXPECT_NE(e.find("sp: expected 4, found 2"), std::string::npos) << e;
  EXPECT_NE(e.find("manifest.json"), std::string::npos) << e;
}

TEST_F(TrainCheckpoint, RefusesTruncatedCorruptedAndMissingState) {
  write_train_checkpoint(tmp_.dir().string(), state(2));
  const fs::path st = tmp_.dir() / "step-00000002" / "state.safetensors";
  const auto size = fs::file_size(st);
  fs::resize_file(st, size - 1);
  EXPECT_NE(usage_error([&] { read(identity_); }).find("truncated"), std::string::npos);
  fs::resize_file(st, size);  // a zero byte where the last one was
  EXPECT_NE(usage_error([&] { read(identity_); }).find("checksum"), std::string::npos);
  fs::remove(st);
  EXPECT_NE(usage_error([&] { read(identity_); }).find("missing"), std::string::npos);
  fs::remove_all(tmp_.dir());
  EXPECT_NE(usage_error([&] { read(identity_); }).find("no checkpoint"), std::string::npos);
}

TEST_F(TrainCheckpoint, ManifestRoundTripsAndItsChecksumIsEnforced) {
  TrainState s = state(3);
  s.manifest.files = {{"state.safetensors", 42, 0x0123456789abcdefull}};
  const std::string text = train_manifest_to_text(s.manifest);
  const TrainManifest back = parse_train_manifest(text, "m");
  EXPECT_EQ(back.files.at(0).fnv1a64, 0x0123456789abcdefull);
  EXPECT_EQ(back.identity, identity_);
  std::string edited = text;
  edited.replace(edited.find("\"bytes\": 42"), 11, "\"bytes\": 43");
  EXPECT_NE(usage_error([&] { parse_train_manifest(edited, "m"); }).find("manifest checksum"),
            std::string::npos);
  EXPECT_NO_THROW(parse_train_manifest(edited, "m", /*check_self_hash=*/false));
  EXPECT_NE(usage_error([&] {
              parse_train_manifest(text.substr(0, text.size() / 2), "m");
            }).find("not valid JSON"),
            std::string::npos);
}

}  // namespace
