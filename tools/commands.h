// Entry points of the `serval` subcommands (tools/main.cpp dispatches on argv[1]).
// Each takes the arguments after the subcommand name (argv[0] is "serval <cmd>")
// and returns the process exit status: 0 ok, 1 runtime failure, 2 bad usage/input.
#pragma once

namespace serval::cli {

int cmd_run(int argc, char** argv);
int cmd_chat(int argc, char** argv);  // serval chat: interactive terminal chat
int cmd_tokenize(int argc, char** argv);
int cmd_gguf(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_bench_grammar(int argc, char** argv);  // serval bench grammar
int cmd_serve(int argc, char** argv);
int cmd_quantize(int argc, char** argv);
int cmd_imatrix(int argc, char** argv);
int cmd_perplexity(int argc, char** argv);
int cmd_plan(int argc, char** argv);
int cmd_gateway(int argc, char** argv);  // serval gateway: router in front of replicas
int cmd_lora(int argc, char** argv);   // serval lora merge BASE ADAPTER OUT
int cmd_batch(int argc, char** argv);  // serval batch IN.jsonl OUT.jsonl  // serval plan, serval plan profile

}  // namespace serval::cli
