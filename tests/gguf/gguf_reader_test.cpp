// GGUF reader/writer: round trips, real files, and the corrupt-file table.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"

using namespace serval;
using namespace serval::gguf;

namespace {

const std::string kShared = SERVAL_SHARED_DIR;

std::vector<uint8_t> f32_bytes(std::initializer_list<float> v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), std::data(v), b.size());
  return b;
}

// A small valid file: a few keys of every type and two tensors.
GgufWriter valid_writer() {
  GgufWriter w;
  w.add("general.architecture", "llama");
  w.add("k.u8", uint8_t{7});
  w.add("k.i8", int8_t{-7});
  w.add("k.u16", uint16_t{700});
  w.add("k.i16", int16_t{-700});
  w.add("k.u32", uint32_t{70000});
  w.add("k.i32", int32_t{-70000});
  w.add("k.f32", 1.5f);
  w.add("k.bool", true);
  w.add("k.u64", uint64_t{1} << 40);
  w.add("k.i64", -(int64_t{1} << 40));
  w.add("k.f64", 2.25);
  Array inner{ValueType::i32, {int32_t{1}, int32_t{2}}};
  Array outer{ValueType::array, {Value(inner), Value(Array{ValueType::i32, {int32_t{3}}})}};
  w.add("k.nested", Value(outer));
  w.add("k.strs", Value(Array{ValueType::string, {"a", "bc", ""}}));
  w.add_tensor("t0", {4}, DType::f32, f32_bytes({1, 2, 3, 4}));
  w.add_tensor("t1", {2, 2}, DType::f32, f32_bytes({5, 6, 7, 8}));
  return w;
}

std::vector<uint8_t> valid_bytes() { return *valid_writer().serialize(); }

}  // namespace

TEST(GgufReader, RoundTripsEveryValueType) {
  auto bytes = valid_writer().serialize();
  ASSERT_TRUE(bytes.ok());
  auto f = GgufFile::parse(*bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(*f->get_string("general.architecture"), "llama");
  EXPECT_EQ(*f->get_uint("k.u8"), 7u);
  EXPECT_EQ(*f->get_int("k.i8"), -7);
  EXPECT_EQ(*f->get_uint("k.u16"), 700u);
  EXPECT_EQ(*f->get_int("k.i16"), -700);
  EXPECT_EQ(*f->get_uint("k.u32"), 70000u);
  EXPECT_EQ(*f->get_int("k.i32"), -70000);
  EXPECT_FLOAT_EQ((float)*f->get_float("k.f32"), 1.5f);
  EXPECT_TRUE(*f->get_bool("k.bool"));
  EXPECT_EQ(*f->get_uint("k.u64"), uint64_t{1} << 40);
  EXPECT_EQ(*f->get_int("k.i64"), -(int64_t{1} << 40));
  EXPECT_DOUBLE_EQ(*f->get_float("k.f64"), 2.25);
  auto nested = f->get_array("k.nested", ValueType::array);
  ASSERT_TRUE(nested.ok());
  ASSERT_EQ((*nested)->items.size(), 2u);
  const auto& first = std::get<std::shared_ptr<const Array>>((*nested)->items[0].v);
  ASSERT_EQ(first->items.size(), 2u);
  EXPECT_EQ(std::get<int32_t>(first->items[1].v), 2);
  auto strs = f->get_array("k.strs", ValueType::string);
  ASSERT_TRUE(strs.ok());
  EXPECT_EQ(std::get<std::string>((*strs)->items[1].v), "bc");
  ASSERT_EQ(f->tensors().size(), 2u);
  const TensorInfo* t1 = f->find_tensor("t1");
  ASSERT_NE(t1, nullptr);
  EXPECT_EQ(t1->dims, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(t1->offset % 32, 0u);
  auto data = f->tensor_data(*t1);
  ASSERT_EQ(data.size(), 16u);
  float v[4];
  std::memcpy(v, data.data(), 16);
  EXPECT_EQ(v[3], 8.0f);
}

TEST(GgufReader, ReadsVersion2AndCustomAlignment) {
  GgufWriter w = valid_writer();
  w.overrides().version = 2;
  w.add("general.alignment", uint32_t{64});
  auto bytes = w.serialize();
  auto f = GgufFile::parse(*bytes);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  for (const auto& t : f->tensors()) EXPECT_EQ(t.offset % 64, 0u);
}

TEST(GgufReader, WriteFileThenOpenViaMmap) {
  const std::string path = ::testing::TempDir() + "/serval_rt.gguf";
  GgufWriter w = valid_writer();
  w.add_tensor("filled", {32}, DType::f32, [](uint8_t* dst, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = (uint8_t)i;
  });
  ASSERT_TRUE(w.write_file(path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  auto d = f->tensor_data(*f->find_tensor("filled"));
  ASSERT_EQ(d.size(), 128u);
  EXPECT_EQ(d[127], 127);
  std::remove(path.c_str());
}

TEST(GgufReader, TypeCheckedGetters) {
  auto f = GgufFile::parse(valid_bytes());
  ASSERT_TRUE(f.ok());
  auto s = f->get_uint("general.architecture");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("general.architecture"), std::string::npos);
  EXPECT_NE(s.status().message().find("got string"), std::string::npos);
  EXPECT_EQ(f->get_string("missing.key").status().code(), StatusCode::not_found);
  EXPECT_FALSE(f->get_uint("k.i8").ok());  // negative into unsigned
  EXPECT_FALSE(f->get_array("k.strs", ValueType::f32).ok());
  EXPECT_FALSE(f->get_bool("k.u8").ok());
}

TEST(GgufReader, OpensEveryShippedModel) {
  for (const char* name :
       {"stories260K.gguf", "mini/mini-llama-F16.gguf", "mini/mini-llama-Q2_K.gguf", "mini/mini-llama-IQ4_NL.gguf",
        "mini/mini-qwen2-Q4_K_M.gguf", "mini/mini-qwen2-Q8_0.gguf"}) {
    auto f = GgufFile::open(kShared + "/models/" + name);
    ASSERT_TRUE(f.ok()) << name << ": " << f.status().message();
    EXPECT_GT(f->tensors().size(), 5u) << name;
    EXPECT_TRUE(f->get_string("general.architecture").ok()) << name;
  }
}

TEST(GgufReader, MissingFileAndNonGguf) {
  auto f = GgufFile::open("/nonexistent/file.gguf");
  EXPECT_EQ(f.status().code(), StatusCode::not_found);
  auto d = GgufFile::open("/");
  EXPECT_FALSE(d.ok());
  auto txt = GgufFile::open(kShared + "/DESIGN.md");
  ASSERT_FALSE(txt.ok());
  EXPECT_NE(txt.status().message().find("bad magic"), std::string::npos);
}

// ---- the corrupt-file table -------------------------------------------------

struct Corrupt {
  const char* name;
  std::function<std::vector<uint8_t>()> make;
  const char* expect;  // substring of the error message
};

namespace {

// Offsets in the fixed header: magic 0, version 4, n_tensors 8, n_kv 16.
template <typename T>
void poke(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

// A file of one key whose value is a string, with the string's length patched.
std::vector<uint8_t> string_len_file(uint64_t len) {
  GgufWriter w;
  w.add("s", "abc");
  auto b = *w.serialize();
  // header 24 + key len 8 + "s" 1 + type 4 = 37: the value's length field.
  poke<uint64_t>(b, 37, len);
  return b;
}

std::vector<uint8_t> one_tensor(std::vector<int64_t> dims, DType t, std::vector<uint8_t> data) {
  GgufWriter w;
  w.add_tensor("w", std::move(dims), t, std::move(data));
  return *w.serialize();
}

}  // namespace

class GgufCorrupt : public ::testing::TestWithParam<Corrupt> {};

TEST_P(GgufCorrupt, RejectedWithNamedReason) {
  const Corrupt& c = GetParam();
  auto f = GgufFile::parse(c.make());
  ASSERT_FALSE(f.ok()) << c.name << " was accepted";
  EXPECT_NE(f.status().message().find(c.expect), std::string::npos)
      << c.name << ": message '" << f.status().message() << "' lacks '" << c.expect << "'";
}

INSTANTIATE_TEST_SUITE_P(
    Table, GgufCorrupt,
    ::testing::Values(
        Corrupt{"bad_magic", [] { auto b = valid_bytes(); b[0] = 'X'; return b; }, "bad magic"},
        Corrupt{"empty", [] { return std::vector<uint8_t>{}; }, "too short"},
        Corrupt{"version_1", [] { auto b = valid_bytes(); poke<uint32_t>(b, 4, 1); return b; }, "unsupported GGUF version 1"},
        Corrupt{"version_99", [] { auto b = valid_bytes(); poke<uint32_t>(b, 4, 99); return b; }, "unsupported GGUF version 99"},
        Corrupt{"huge_n_tensors", [] { auto b = valid_bytes(); poke<uint64_t>(b, 8, ~0ull); return b; }, "n_tensors"},
        Corrupt{"huge_n_kv", [] { auto b = valid_bytes(); poke<uint64_t>(b, 16, 1ull << 62); return b; }, "n_kv"},
        Corrupt{"n_kv_too_large_by_one", [] {
          GgufWriter w = valid_writer(); w.overrides().n_kv = 15; return *w.serialize(); }, "tensor"},
        Corrupt{"string_length_overflow", [] { return string_len_file(~0ull); }, "string length"},
        Corrupt{"string_length_past_eof", [] { return string_len_file(1u << 20); }, "past the end"},
        Corrupt{"array_length_huge", [] {
          GgufWriter w; w.add("a", Value(Array{ValueType::u64, {uint64_t{1}}}));
          auto b = *w.serialize(); poke<uint64_t>(b, 37 + 4, 1ull << 61); return b; }, "array of"},
        Corrupt{"bad_value_type", [] {
          GgufWriter w; w.add("a", uint32_t{1}); auto b = *w.serialize(); poke<uint32_t>(b, 33, 13); return b; }, "invalid value type 13"},
        Corrupt{"bool_not_0_1", [] {
          GgufWriter w; w.add("a", true); auto b = *w.serialize(); b[37] = 2; return b; }, "bool"},
        Corrupt{"n_dims_5", [] {
          GgufWriter w; w.add_tensor("w", {1, 1, 1, 1, 4}, DType::f32, std::vector<uint8_t>(16)); return *w.serialize(); }, "n_dims = 5"},
        Corrupt{"zero_dim", [] { return one_tensor({4, 0}, DType::f32, {}); }, "dimension 1 = 0"},
        Corrupt{"element_count_overflow", [] {
          GgufWriter w; w.add_tensor("w", {1ll << 40, 1ll << 40}, DType::f32, std::vector<uint8_t>(16)); return *w.serialize(); }, "element count overflows"},
        Corrupt{"byte_size_huge", [] {
          GgufWriter w; w.add_tensor("w", {1ll << 31, 1ll << 31}, DType::f32, std::vector<uint8_t>(16)); return *w.serialize(); }, "byte size overflows"},
        Corrupt{"offset_past_eof", [] {
          GgufWriter w; w.add_tensor("w", {4}, DType::f32, f32_bytes({1, 2, 3, 4})); w.override_last_offset(1 << 20);
          auto b = *w.serialize(); b.resize(b.size() - (1 << 20)); return b; }, "past the end"},
        Corrupt{"misaligned_offset", [] {
          GgufWriter w; w.add_tensor("w", {4}, DType::f32, f32_bytes({1, 2, 3, 4})); w.override_last_offset(4); return *w.serialize(); }, "not a multiple of the alignment"},
        Corrupt{"overlapping_tensors", [] {
          GgufWriter w; w.add_tensor("a", {16}, DType::f32, std::vector<uint8_t>(64));
          w.add_tensor("b", {16}, DType::f32, std::vector<uint8_t>(64)); w.override_last_offset(32); return *w.serialize(); }, "overlaps"},
        Corrupt{"duplicate_key", [] { GgufWriter w; w.add("a", 1); w.add("a", 2); return *w.serialize(); }, "duplicate metadata key 'a'"},
        Corrupt{"duplicate_tensor", [] {
          GgufWriter w; w.add_tensor("x", {4}, DType::f32, std::vector<uint8_t>(16));
          w.add_tensor("x", {4}, DType::f32, std::vector<uint8_t>(16)); return *w.serialize(); }, "duplicate tensor name 'x'"},
        Corrupt{"bad_tensor_type", [] {
          GgufWriter w; w.add_tensor("w", {4}, DType::f32, std::vector<uint8_t>(16)); w.override_last_type(4); return *w.serialize(); }, "invalid tensor type 4"},
        Corrupt{"ik_llama_cpp_tensor_type", [] {
          GgufWriter w; w.add_tensor("w", {4}, DType::f32, std::vector<uint8_t>(16)); w.override_last_type(140); return *w.serialize(); },
                "tensor type 140 is ik_llama.cpp's IQ5_K, which serval does not read"},
        Corrupt{"row_not_block_multiple", [] {
          GgufWriter w; w.add_tensor("w", {48}, DType::q4_0, std::vector<uint8_t>(18)); return *w.serialize(); }, "not a multiple of the q4_0 block size 32"},
        Corrupt{"alignment_not_power_of_two", [] {
          GgufWriter w; w.add("general.alignment", uint32_t{24}); return *w.serialize(); }, "general.alignment"},
        Corrupt{"alignment_wrong_type", [] {
          GgufWriter w; w.add("general.alignment", "32"); return *w.serialize(); }, "expected u32, got string"},
        Corrupt{"truncated_in_kv", [] { auto b = valid_bytes(); b.resize(240); return b; }, "truncated"},
        Corrupt{"truncated_in_tensor_data", [] { auto b = valid_bytes(); b.resize(b.size() - 20); return b; }, "past the end"},
        Corrupt{"deep_nested_arrays", [] {
          Array a{ValueType::u8, {uint8_t{1}}};
          for (int i = 0; i < 12; ++i) a = Array{ValueType::array, {Value(a)}};
          GgufWriter w; w.add("deep", Value(a)); return *w.serialize(); }, "nested deeper"}),
    [](const ::testing::TestParamInfo<Corrupt>& i) { return std::string(i.param.name); });

// Every truncation of a valid file is rejected cleanly (never a crash).
TEST(GgufReader, EveryTruncationIsRejected) {
  const auto full = valid_bytes();
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> b(full.begin(), full.begin() + n);
    auto f = GgufFile::parse(b);
    // Only the padding after the last tensor may be cut without harm.
    if (f.ok()) {
      EXPECT_GE(n, full.size() - 16) << "accepted a truncation to " << n << " bytes";
    }
  }
}
