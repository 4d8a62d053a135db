// Tune files: rows round-trip under their key, other keys survive a save, and malformed files or
// rows are refused with a message naming the file.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "layer_factory.h"
#include "qmoe/tuning.h"

namespace qmoe::test {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "qmoe_tune_" + name + "_" + std::to_string(fresh_seed()) + ".json";
}

TEST(Tuning, RowsRoundTripAndOtherKeysSurvive) {
  const std::string path = temp_path("roundtrip");
  const std::vector<TunedRow> a = {{1, "decode/1"}, {16, "fused"}, {64, "generic"}};
  const std::vector<TunedRow> b = {{8, "generic"}};
  ASSERT_TRUE(save_tuned_rows(path, "layer A", a).is_ok());
  ASSERT_TRUE(save_tuned_rows(path, "layer B", b).is_ok());
  std::vector<TunedRow> got;
  bool found = false;
  ASSERT_TRUE(load_tuned_rows(path, "layer A", &got, &found).is_ok());
  ASSERT_TRUE(found);
  ASSERT_EQ(got.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(got[i].max_tokens, a[i].max_tokens);
    EXPECT_EQ(got[i].choice, a[i].choice);
  }
  ASSERT_TRUE(load_tuned_rows(path, "layer B", &got, &found).is_ok());
  ASSERT_TRUE(found);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].choice, "generic");
  ASSERT_TRUE(load_tuned_rows(path, "layer C", &got, &found).is_ok());
  EXPECT_FALSE(found);
  EXPECT_TRUE(got.empty());
  std::remove(path.c_str());
}

TEST(Tuning, MissingFileIsNotAnError) {
  std::vector<TunedRow> got;
  bool found = true;
  EXPECT_TRUE(load_tuned_rows(temp_path("absent"), "k", &got, &found).is_ok());
  EXPECT_FALSE(found);
}

TEST(Tuning, MalformedFilesAndRowsAreRefused) {
  const std::string path = temp_path("bad");
  auto write = [&](const std::string& text) {
    std::ofstream f(path, std::ios::trunc);
    f << text;
  };
  std::vector<TunedRow> got;
  bool found = false;
  for (const std::string& text :
       {std::string("not json"), std::string("{\"layers\": {}}"),
        std::string("{\"qmoe_tune\": 1, \"layers\": {\"k\": [{\"max_tokens\": 8}]}}"),
        std::string("{\"qmoe_tune\": 1, \"layers\": {\"k\": [{\"max_tokens\": 8, \"choice\": "
                    "\"generic\"}, {\"max_tokens\": 4, \"choice\": \"generic\"}]}}")}) {
    write(text);
    const Status s = load_tuned_rows(path, "k", &got, &found);
    EXPECT_FALSE(s.is_ok()) << text;
    EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  }
  write("not json");
  EXPECT_FALSE(save_tuned_rows(path, "k", {{1, "generic"}}).is_ok());  // never clobbers
  std::remove(path.c_str());
  EXPECT_FALSE(save_tuned_rows(path, "k", {{4, "generic"}, {2, "generic"}}).is_ok());
}

TEST(Tuning, KeyNamesDeviceShapeAndFormats) {
  LayerSpec s = small_spec(WeightFormat::kInt4, 256, 128, 16, 4);
  const std::string k = tune_key(s, "NVIDIA H200");
  EXPECT_NE(k.find("NVIDIA H200"), std::string::npos);
  EXPECT_NE(k.find("H 256 I 128 E 16 slots 4"), std::string::npos) << k;
  LayerSpec t = s;
  t.fc2.block_size = s.fc2.block_size == 64 ? 128 : 64;
  EXPECT_NE(tune_key(t, "NVIDIA H200"), k);
  t = s;
  t.act_dtype = s.act_dtype == DType::kBF16 ? DType::kF16 : DType::kBF16;
  EXPECT_NE(tune_key(t, "NVIDIA H200"), k);
  EXPECT_NE(tune_key(s, "NVIDIA H100"), k);
  // Shards (local experts) get keys of their own, apart from the whole layer and from each other.
  t = s;
  t.local_experts = 8;
  const std::string first_half = tune_key(t, "NVIDIA H200");
  EXPECT_NE(first_half, k);
  EXPECT_NE(first_half.find("local 0+8"), std::string::npos) << first_half;
  t.first_expert = 8;
  EXPECT_NE(tune_key(t, "NVIDIA H200"), first_half);
}

}  // namespace
}  // namespace qmoe::test
