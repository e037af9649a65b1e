// serval bench model: llama-bench's prompt-processing (pp) and text-generation
// (tg) tests through the batched forward (tools/bench_model.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "model/model.h"

namespace serval::cli {

struct ModelFigures {
  uint64_t file_bytes = 0;      // all tensors
  uint64_t params = 0;          // all tensor elements
  uint64_t matrix_bytes = 0;    // weights one forward reads in full
  uint64_t matrix_elems = 0;
  uint64_t embd_row_bytes = 0;  // one token's embedding row
  std::string type_name;        // the type most matrix bytes are stored in
};

// The figures of m that bench model and plan profile report.
ModelFigures model_figures(const Model& m);

// argv[0] is the command name ("serval bench model"); 0 ok, 1 runtime failure,
// 2 bad usage.
int cmd_bench_model(int argc, char** argv);

}  // namespace serval::cli
