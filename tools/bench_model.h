// serval bench model: llama-bench's prompt-processing (pp) and text-generation
// (tg) tests through the batched forward (tools/bench_model.cpp).
#pragma once

namespace serval::cli {

// argv[0] is the command name ("serval bench model"); 0 ok, 1 runtime failure,
// 2 bad usage.
int cmd_bench_model(int argc, char** argv);

}  // namespace serval::cli
