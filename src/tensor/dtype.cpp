#include "tensor/dtype.h"

#include <array>
#include <cctype>
#include <string>
#include <utility>

namespace serval {
namespace {

constexpr uint32_t QK_K = 256;

struct Entry {
  uint32_t id;
  DTypeTraits traits;
};

// Block geometry per ggml's type table (type_size in bytes per block).
constexpr std::array<Entry, 32> kTable = {{
    {0, {"f32", 1, 4, true}},
    {1, {"f16", 1, 2, true}},
    {2, {"q4_0", 32, 2 + 16, true}},
    {3, {"q4_1", 32, 2 + 2 + 16, true}},
    {6, {"q5_0", 32, 2 + 4 + 16, true}},
    {7, {"q5_1", 32, 2 + 2 + 4 + 16, true}},
    {8, {"q8_0", 32, 2 + 32, true}},
    {9, {"q8_1", 32, 4 + 32, false}},
    {10, {"q2_K", QK_K, QK_K / 16 + QK_K / 4 + 2 + 2, true}},
    {11, {"q3_K", QK_K, QK_K / 8 + QK_K / 4 + 12 + 2, true}},
    {12, {"q4_K", QK_K, 2 + 2 + 12 + QK_K / 2, true}},
    {13, {"q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2, true}},
    {14, {"q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2, true}},
    {15, {"q8_K", QK_K, 4 + QK_K + QK_K / 16 * 2, false}},
    {16, {"iq2_xxs", QK_K, 2 + QK_K / 8 * 2, true}},
    {17, {"iq2_xs", QK_K, 2 + QK_K / 8 * 2 + QK_K / 32, true}},
    {18, {"iq3_xxs", QK_K, 2 + QK_K / 4 + QK_K / 8, true}},
    {19, {"iq1_s", QK_K, 2 + QK_K / 8 + QK_K / 16, true}},
    {20, {"iq4_nl", 32, 2 + 16, true}},
    {21, {"iq3_s", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4, true}},
    {22, {"iq2_s", QK_K, 2 + QK_K / 4 + QK_K / 16, true}},
    {23, {"iq4_xs", QK_K, 2 + 2 + QK_K / 64 + QK_K / 2, true}},
    {24, {"i8", 1, 1, false}},
    {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},
    {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},
    {29, {"iq1_m", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32, true}},
    {30, {"bf16", 1, 2, true}},
    {34, {"tq1_0", QK_K, 2 + 4 * 13, true}},
    {35, {"tq2_0", QK_K, 2 + QK_K / 4, true}},
    {39, {"mxfp4", 32, 1 + 16, true}},
}};

}  // namespace

std::string foreign_type_name(uint32_t id) {
  // Ids as the forks' ggml.h number them (interop facts, for naming only).
  static constexpr std::pair<uint32_t, std::string_view> kOld[] = {
      {31, "Q4_0_4_4 (an ARM repacked Q4_0 that llama.cpp removed)"},
      {32, "Q4_0_4_8 (an ARM repacked Q4_0 that llama.cpp removed)"},
      {33, "Q4_0_8_8 (an ARM repacked Q4_0 that llama.cpp removed)"},
      {36, "I2_S (Microsoft BitNet's)"},
      {41, "ik_llama.cpp's Q1_0_G128"},
      {97, "ik_llama.cpp's Q8_0_X4"},  {98, "ik_llama.cpp's Q8_1_X4"},  {99, "ik_llama.cpp's Q8_2_X4"},
      {133, "ik_llama.cpp's Q6_0"},    {134, "ik_llama.cpp's IQ1_BN"},  {135, "ik_llama.cpp's IQ2_BN"},
      {136, "ik_llama.cpp's Q8_K64"},  {137, "ik_llama.cpp's IQ2_K"},   {138, "ik_llama.cpp's IQ3_K"},
      {139, "ik_llama.cpp's IQ4_K"},   {140, "ik_llama.cpp's IQ5_K"},   {141, "ik_llama.cpp's IQ6_K"},
      {144, "ik_llama.cpp's IQ4_KS"},  {145, "ik_llama.cpp's IQ2_KS"},  {146, "ik_llama.cpp's IQ4_KSS"},
      {152, "ik_llama.cpp's IQ5_KS"},  {153, "ik_llama.cpp's IQ2_KT"},  {154, "ik_llama.cpp's IQ3_KT"},
      {155, "ik_llama.cpp's IQ4_KT"},  {156, "ik_llama.cpp's IQ3_KS"},  {157, "ik_llama.cpp's IQ2_KL"},
      {158, "ik_llama.cpp's IQ1_KT"},
  };
  for (const auto& [i, name] : kOld)
    if (i == id) return std::string(name);
  // ik_llama.cpp's run-time repacked forms (written by llama-quantize --repack or -rtr saves): 200-399.
  if (id >= 200 && id < 400) return "one of ik_llama.cpp's repacked _R4/_R8/_R16 types";
  return {};
}

std::optional<DTypeTraits> dtype_traits(uint32_t raw_type) {
  for (const auto& e : kTable)
    if (e.id == raw_type) return e.traits;
  return std::nullopt;
}

std::string_view dtype_name(DType t) {
  auto tr = dtype_traits(t);
  return tr ? tr->name : std::string_view("unknown");
}

std::optional<DType> dtype_from_name(std::string_view name) {
  auto lower = [](std::string_view s) {
    std::string r(s);
    for (auto& c : r) c = (char)std::tolower((unsigned char)c);
    return r;
  };
  const std::string want = lower(name);
  for (const auto& e : kTable)
    if (lower(e.traits.name) == want) return (DType)e.id;
  return std::nullopt;
}

}  // namespace serval
