// `bert`: BERT-family encoders (sentence-transformers models such as
// all-MiniLM, bge, e5; and BERT rerankers with a classification head).
//   keys: the common ones, attention.layer_norm_epsilon, attention.causal
//         (must be false), pooling_type (default mean)
//   tensors: token_embd, token_types, position_embd, token_embd_norm
//            (weight, bias), per layer attn_{q,k,v} (weight, bias),
//            attn_output (weight, bias), attn_output_norm, ffn_up, ffn_down
//            (weights, biases), layer_output_norm; rerankers cls and
//            cls.output (weight, bias)
//   layout: model_config.h EncoderRecipe with absolute positions and GELU
#include "model/family.h"

namespace serval {
namespace {

Status read_config(const HparamReader& r, ModelConfig& c) {
  c.enc.abs_pos = true;
  return read_encoder_hparams(r, c);
}

}  // namespace

extern const Family kBertFamily{"bert", read_config, load_encoder};

}  // namespace serval
