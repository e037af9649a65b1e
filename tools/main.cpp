// serval: one binary, subcommands. See `serval --help`.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"

namespace {

void usage(FILE* f) {
  std::fprintf(f,
               "usage: serval <command> [options]\n"
               "\n"
               "commands:\n"
               "  serve      serve a model behind an OpenAI-compatible HTTP API\n"
               "  run        generate text from a prompt (streams to stdout)\n"
               "  chat       chat with a model in the terminal (its chat template; /help inside)\n"
               "  tokenize   print the token ids (and pieces) of a text\n"
               "  gguf       inspect (info) or synthesize (synth) GGUF files\n"
               "  quantize   quantize a GGUF model (Q8_0, Q4_0, Q4_K_M, Q5_K_M, Q6_K, IQ4_NL, ...)\n"
               "  lora       merge a LoRA adapter into its base model (lora merge)\n"
               "  imatrix    importance matrix of a model over a text (for quantize --imatrix)\n"
               "  perplexity perplexity over a text; KL divergence against a reference model\n"
               "  bench      benchmarks (throughput: the engine under load; model: pp/tg like llama-bench; http)\n"
               "  batch      run an OpenAI batch file (JSONL) offline, resumable\n"
               "  plan       capacity planning: profile a model on this machine, predict latency and size replicas\n"
               "  gateway    one endpoint in front of many replicas: routing, keys, quotas, budgets, retries, fallback\n"
               "\n"
               "Run 'serval <command> --help' for the options of a command.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "serval: missing command (usage: serval <command> [options]; see 'serval --help')\n");
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "--version") {
    std::printf("serval 0.1.0\n");
    return 0;
  }
  // Sub-command sees argv[0] = "serval <cmd>" so CLI11 help reads naturally.
  std::string name = "serval " + cmd;
  argv[1] = name.data();
  if (cmd == "run") return serval::cli::cmd_run(argc - 1, argv + 1);
  if (cmd == "chat") return serval::cli::cmd_chat(argc - 1, argv + 1);
  if (cmd == "serve") return serval::cli::cmd_serve(argc - 1, argv + 1);
  if (cmd == "tokenize") return serval::cli::cmd_tokenize(argc - 1, argv + 1);
  if (cmd == "gguf") return serval::cli::cmd_gguf(argc - 1, argv + 1);
  if (cmd == "quantize") return serval::cli::cmd_quantize(argc - 1, argv + 1);
  if (cmd == "lora") return serval::cli::cmd_lora(argc - 1, argv + 1);
  if (cmd == "imatrix") return serval::cli::cmd_imatrix(argc - 1, argv + 1);
  if (cmd == "perplexity") return serval::cli::cmd_perplexity(argc - 1, argv + 1);
  if (cmd == "bench") return serval::cli::cmd_bench(argc - 1, argv + 1);
  if (cmd == "batch") return serval::cli::cmd_batch(argc - 1, argv + 1);
  if (cmd == "plan") return serval::cli::cmd_plan(argc - 1, argv + 1);
  if (cmd == "gateway") return serval::cli::cmd_gateway(argc - 1, argv + 1);
  std::fprintf(stderr, "serval: unknown command '%s' (see 'serval --help')\n", cmd.c_str());
  return 2;
}
