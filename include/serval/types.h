// Basic public types shared by every layer.
#pragma once

#include <cstdint>

namespace serval {

// A token id. Also declared (identically, which is legal) by the tokenizer and
// sampling_params.h.
using TokenId = int32_t;

}  // namespace serval
