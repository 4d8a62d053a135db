// safetensors reader and writer: bitwise round trips on fresh random tensors, and one test per
// malformed file asserting that the error names the problem.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "qmoe/io.h"
#include "test_util.h"

namespace qmoe {
namespace {

class SafetensorsTest : public test::TempDirTest {
 protected:
  // A file of the 8-byte length, `header` (as is, unpadded) and `data_bytes` bytes of data.
  std::string raw(const std::string& header, size_t data_bytes, uint64_t length_field = ~0ull) {
    std::string p = path("raw.safetensors");
    uint64_t n = length_field == ~0ull ? header.size() : length_field;
    std::string bytes(reinterpret_cast<const char*>(&n), 8);
    bytes += header;
    for (size_t i = 0; i < data_bytes; ++i) bytes += static_cast<char>(i * 7 + 1);
    std::ofstream(p, std::ios::binary).write(bytes.data(), bytes.size());
    return p;
  }
  Status open(const std::string& p) { return SafetensorsFile::open(p, &file_); }
  // Asserts an error of `code` whose message contains every fragment.
  void expect_error(const Status& s, StatusCode code, std::initializer_list<const char*> parts) {
    ASSERT_FALSE(s.is_ok()) << "expected an error";
    EXPECT_EQ(s.code(), code) << s.to_string();
    for (const char* part : parts)
      EXPECT_NE(s.message().find(part), std::string::npos)
          << "'" << part << "' not in: " << s.message();
  }

  std::unique_ptr<SafetensorsFile> file_;
};

std::vector<uint8_t> random_bytes(size_t n, std::mt19937_64* rng) {
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>((*rng)());
  return b;
}

TEST_F(SafetensorsTest, RoundTripIsBitwise) {
  std::mt19937_64 rng(test::fresh_seed());
  struct Spec {
    const char* name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  // Mixed element sizes in an order that would misalign the wide ones if stored as given.
  const std::vector<Spec> specs = {
      {"codes", DType::kU8, {3, 5, 7}}, {"scales", DType::kBF16, {3, 5}},
      {"w", DType::kF32, {2, 3, 4, 5}}, {"scalar", DType::kF64, {}},
      {"e4m3", DType::kF8E4M3, {9}},    {"e8m0", DType::kF8E8M0, {4, 1}},
      {"i8", DType::kI8, {11}},         {"i32", DType::kI32, {2, 3}},
      {"half", DType::kF16, {1, 1, 3}}, {"empty", DType::kF32, {4, 0}},
      {"last_u8", DType::kU8, {1}},
  };
  std::vector<std::vector<uint8_t>> data;
  std::vector<NamedTensor> tensors;
  for (const Spec& s : specs) {
    TensorView v;
    v.dtype = s.dtype;
    v.rank = static_cast<int>(s.shape.size());
    for (int i = 0; i < v.rank; ++i) v.dims[i] = s.shape[i];
    data.push_back(random_bytes(v.bytes(), &rng));
    v.data = data.back().empty() ? static_cast<const void*>(&rng) : data.back().data();
    tensors.push_back({s.name, v});
  }
  const std::map<std::string, std::string> meta = {{"a", "1"}, {"quote", "\"x\"\n"}, {"", "e"}};
  const std::string p = path("round.safetensors");
  ASSERT_TRUE(write_safetensors(p, tensors, meta).is_ok());

  ASSERT_TRUE(open(p).is_ok());
  EXPECT_EQ(file_->metadata(), meta);
  ASSERT_EQ(file_->names().size(), specs.size());
  size_t total = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorView* v = file_->find(specs[i].name);
    ASSERT_NE(v, nullptr) << specs[i].name;
    EXPECT_EQ(v->dtype, specs[i].dtype);
    ASSERT_EQ(v->rank, static_cast<int>(specs[i].shape.size()));
    for (int d = 0; d < v->rank; ++d) EXPECT_EQ(v->dims[d], specs[i].shape[d]);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data) % dtype_size(v->dtype), 0u) << specs[i].name;
    ASSERT_EQ(v->bytes(), data[i].size());
    if (!data[i].empty()) {
      EXPECT_EQ(std::memcmp(v->data, data[i].data(), data[i].size()), 0) << specs[i].name;
    }
    total += data[i].size();
  }
  // The header is padded to 8 bytes and the data follows with no gaps.
  std::ifstream in(p, std::ios::binary | std::ios::ate);
  const size_t file_bytes = static_cast<size_t>(in.tellg());
  in.seekg(0);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(file_bytes, 8 + n + total);
}

TEST_F(SafetensorsTest, AcceptsGapsAndCopiesMisalignedTensors) {
  // f32 at offset 1 (misaligned), 3 bytes of gap before a u8 tensor.
  const std::string h = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[1,9]},)"
                        R"("b":{"dtype":"U8","shape":[2],"data_offsets":[12,14]}})";
  const std::string p = raw(h, 14);
  ASSERT_TRUE(open(p).is_ok());
  const TensorView* a = file_->find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 4, 0u);
  const uint8_t* bytes = static_cast<const uint8_t*>(a->data);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(bytes[i], static_cast<uint8_t>((i + 1) * 7 + 1));
  EXPECT_EQ(static_cast<const uint8_t*>(file_->find("b")->data)[0],
            static_cast<uint8_t>(12 * 7 + 1));
  EXPECT_EQ(file_->names(), (std::vector<std::string>{"a", "b"}));
}

TEST_F(SafetensorsTest, MissingFileIsIoError) {
  expect_error(open(dir_ + "/nope.safetensors"), StatusCode::kIoError, {"nope.safetensors"});
}

TEST_F(SafetensorsTest, FileShorterThanLengthField) {
  const std::string p = path("short.safetensors");
  std::ofstream(p, std::ios::binary).write("abc", 3);
  expect_error(open(p), StatusCode::kInvalidArgument,
               {"short.safetensors", "3 bytes", "at least 8"});
}

TEST_F(SafetensorsTest, HeaderLengthPastEndOfFile) {
  expect_error(open(raw("{}", 0, 100)), StatusCode::kInvalidArgument,
               {"header length 100", "10-byte file"});
}

TEST_F(SafetensorsTest, HeaderLengthOverCap) {
  expect_error(open(raw("{}", 0, kMaxSafetensorsHeaderBytes + 1)), StatusCode::kInvalidArgument,
               {"exceeds the limit"});
}

TEST_F(SafetensorsTest, HeaderNotJson) {
  expect_error(open(raw("{\"a\": ", 0)), StatusCode::kInvalidArgument, {"not valid JSON"});
}

TEST_F(SafetensorsTest, HeaderNotAnObject) {
  expect_error(open(raw("[1, 2]  ", 0)), StatusCode::kInvalidArgument,
               {"expected a JSON object", "array"});
}

TEST_F(SafetensorsTest, MetadataNotAnObject) {
  expect_error(open(raw(R"({"__metadata__": [1]})", 0)), StatusCode::kInvalidArgument,
               {"__metadata__", "expected an object of strings"});
}

TEST_F(SafetensorsTest, MetadataValueNotString) {
  expect_error(open(raw(R"({"__metadata__": {"k": 3}})", 0)), StatusCode::kInvalidArgument,
               {"__metadata__['k']", "expected a string value", "number"});
}

TEST_F(SafetensorsTest, UnsupportedDtypeNamesTensorAndDtype) {
  expect_error(open(raw(R"({"w":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", 8)),
               StatusCode::kUnsupported, {"tensor 'w'", "unsupported dtype 'C64'"});
}

TEST_F(SafetensorsTest, NegativeDimension) {
  expect_error(open(raw(R"({"w":{"dtype":"U8","shape":[2,-1],"data_offsets":[0,0]}})", 0)),
               StatusCode::kInvalidArgument,
               {"tensor 'w'", "dimension 1", "not a non-negative integer"});
}

TEST_F(SafetensorsTest, NonIntegerDimension) {
  expect_error(open(raw(R"({"w":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", 2)),
               StatusCode::kInvalidArgument, {"tensor 'w'", "dimension 0"});
}

TEST_F(SafetensorsTest, RankAboveFour) {
  expect_error(open(raw(R"({"w":{"dtype":"U8","shape":[1,1,1,1,1],"data_offsets":[0,1]}})", 1)),
               StatusCode::kInvalidArgument, {"tensor 'w'", "rank 5", "at most 4"});
}

TEST_F(SafetensorsTest, OffsetsBeginAfterEnd) {
  expect_error(open(raw(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,2]}})", 4)),
               StatusCode::kInvalidArgument, {"tensor 'w'", "[4, 2)", "begin > end"});
}

TEST_F(SafetensorsTest, OffsetsMalformed) {
  expect_error(open(raw(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", 4)),
               StatusCode::kInvalidArgument, {"tensor 'w'", "data_offsets: expected [begin, end]"});
}

TEST_F(SafetensorsTest, HeaderLiesAboutSize) {
  expect_error(open(raw(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24)),
               StatusCode::kInvalidArgument,
               {"tensor 'w'", "hold 20 bytes", "expected 24", "F32 [2, 3]"});
}

TEST_F(SafetensorsTest, SizeOverflowIsRejected) {
  const std::string h =
      R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})";
  expect_error(open(raw(h, 8)), StatusCode::kInvalidArgument, {"tensor 'w'", "too large"});
}

TEST_F(SafetensorsTest, TruncatedData) {
  expect_error(open(raw(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 12)),
               StatusCode::kInvalidArgument,
               {"tensor 'w'", "end past the data section of 12 bytes"});
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  const std::string h = R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                        R"("b":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}})";
  expect_error(open(raw(h, 10)), StatusCode::kInvalidArgument,
               {"'a' [0, 8)", "'b' [6, 10)", "overlap"});
}

TEST_F(SafetensorsTest, DuplicateTensorName) {
  const std::string h = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                        R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  expect_error(open(raw(h, 2)), StatusCode::kInvalidArgument, {"'a' twice", "duplicate tensor"});
}

TEST_F(SafetensorsTest, MissingField) {
  expect_error(open(raw(R"({"w":{"dtype":"U8","shape":[1]}})", 1)), StatusCode::kInvalidArgument,
               {"tensor 'w'", "missing 'data_offsets'"});
}

TEST_F(SafetensorsTest, UnknownFieldInEntry) {
  const std::string h = R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"stride":[1]}})";
  expect_error(open(raw(h, 1)), StatusCode::kInvalidArgument, {"tensor 'w'", "'stride'"});
}

TEST_F(SafetensorsTest, EntryNotAnObject) {
  expect_error(open(raw(R"({"w": 5})", 0)), StatusCode::kInvalidArgument,
               {"tensor 'w'", "expected an object"});
}

TEST_F(SafetensorsTest, GetNamesTheMissingTensor) {
  const std::string p = raw(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  ASSERT_TRUE(open(p).is_ok());
  TensorView v;
  expect_error(file_->get("fc1_scales", &v), StatusCode::kInvalidArgument,
               {"missing tensor 'fc1_scales'", "raw.safetensors"});
}

TEST_F(SafetensorsTest, WriterRejectsDuplicatesAndAbsentViews) {
  uint8_t b = 0;
  const TensorView v(&b, DType::kU8, {1});
  expect_error(write_safetensors(path("w.safetensors"), {{"x", v}, {"x", v}}),
               StatusCode::kInvalidArgument, {"'x' given twice"});
  expect_error(write_safetensors(path("w.safetensors"), {{"y", TensorView()}}),
               StatusCode::kInvalidArgument, {"'y'", "absent"});
}

}  // namespace
}  // namespace qmoe
