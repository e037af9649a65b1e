// Which type each tensor of a model gets when it is quantized to a "file type"
// (llama.cpp's llama_ftype: Q4_K_M, Q8_0, ...). The rules follow llama.cpp's
// llama_tensor_get_type for the llama family, so users get the mixes they know:
//
//  - Only tensors named "*weight" with >= 2 dimensions are quantized; 1-D
//    tensors (norms, biases) keep their type.
//  - output.weight (token_embd.weight when the output is tied) -> Q6_K, unless
//    the file type is Q8_0 (stays Q8_0) or its rows do not fit the base type's
//    block (-> Q8_0).
//  - Q4_K_M / Q5_K_M: attn_v and ffn_down of the "more bits" layers
//    (use_more_bits: the first and last eighth, and every third in between)
//    -> Q6_K. Q4_K_S: attn_v of layers 0-3 and ffn_down of the first eighth
//    -> Q5_K. IQ4_NL, IQ4_XS: attn_v -> Q5_K when n_head / n_head_kv >= 4; without
//    an imatrix, ffn_down of the first eighth -> Q5_K. Q2_K: attn_v -> Q3_K
//    (Q4_K when n_head / n_head_kv >= 4), ffn_down and attn_output -> Q3_K.
//    Q3_K_M: attn_v of layers 0-1 -> Q5_K, the rest Q4_K; ffn_down -> Q4_K
//    (Q5_K in the first sixteenth), attn_output -> Q4_K. Q3_K_L: attn_v,
//    ffn_down, attn_output -> Q5_K. Fused attn_qkv: Q3_K_M/L -> Q4_K, Q4_K_M
//    -> Q5_K, Q5_K_M -> Q6_K.
//    Q4_0 / Q5_0 with an
//    imatrix: ffn_down of the first eighth -> Q4_1 / Q5_1.
//  - The lattice mixes (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M): output
//    -> Q5_K, token_embd -> Q2_K (IQ3_S for IQ2_S/M), attn_v -> Q2_K (IQ3_S
//    for IQ2_S/M; Q4_K when n_head / n_head_kv >= 4 or >= 4 experts),
//    ffn_down of the first eighth likewise, attn_output -> IQ2_XXS for IQ1_*
//    and IQ3_S for IQ2_S/M. IQ3_XXS: attn_q/attn_k -> IQ2_S, attn_output and
//    token_embd -> IQ3_S, output -> Q5_K. IQ3_XS: IQ3_S with attn_q/attn_k and
//    the middle layers' ffn_gate/ffn_up in IQ3_XXS. IQ3_M: attn_v,
//    attn_output and the first eighth's ffn_down -> Q4_K. TQ1_0/TQ2_0:
//    token_embd -> Q4_K. With 8 experts attn_k/attn_v -> Q8_0 (Q4_K for the
//    lattice mixes) and attn_output -> Q5_K, as llama.cpp does.
//  - Row-length fallback: a tensor whose row length (ne[0]) is not a multiple
//    of the chosen type's block size takes llama.cpp's substitute (Q4_K ->
//    Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, IQ4_XS and the lattice types ->
//    IQ4_NL, TQ -> Q4_0); if that block does not fit either (or
//    the type has no substitute: the 32-element types), the tensor keeps its
//    source type, losslessly. (llama.cpp stops with "Unsupported tensor size"
//    there, e.g. on stories260K's ffn_down with rows of 172.)
//
// Pure functions of the tensor list and the metadata; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "gguf/gguf_reader.h"
#include "tensor/dtype.h"

namespace serval::quant {

struct FileType {
  std::string_view name;  // as llama-quantize spells it: "Q4_K_M"
  uint32_t ftype;         // general.file_type (llama_ftype)
  DType base;             // type of most weight matrices
  std::string_view help;
};

// Every file type `serval quantize` writes.
const std::vector<FileType>& file_types();
// Case-insensitive; "Q4_K" and "Q5_K" are llama-quantize's aliases of Q4_K_M / Q5_K_M.
std::optional<FileType> find_file_type(std::string_view name);
// "Q8_0, Q4_0, ..." for error messages.
std::string file_type_names();

// True for F32, F16, BF16: sources that quantize without losing what they hold.
bool is_float_type(DType t);

struct TensorPlan {
  DType type;              // type in the output file
  bool quantize = false;   // converted (else copied byte for byte)
  bool fallback = false;   // the row-length fallback applied
};

// llama.cpp's rule for the very low-bit types: a tensor becoming IQ2_XXS,
// IQ2_XS, IQ2_S or IQ1_S (IQ1_M except token_embd/output; Q2_K in a Q2_K_S
// mix except token_embd) must have an imatrix entry.
bool needs_imatrix(const FileType& ft, const std::string& tensor, DType type);

// The plan for every tensor of `src`, in file order. has_imatrix changes the
// IQ4_NL / IQ3_XXS / Q4_0 / Q5_0 rules as in llama.cpp.
std::vector<TensorPlan> plan_tensors(const gguf::GgufFile& src, const FileType& ft, bool has_imatrix);

}  // namespace serval::quant
