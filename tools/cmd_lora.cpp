// serval lora merge BASE ADAPTER OUT [--scale S] [--f16]: the base model with
// a LoRA adapter merged into its weights (W + scale * B·A), for checking an
// adapter against its merged model and for users who want a static model.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>

#include "cli_util.h"
#include "commands.h"
#include "model/lora.h"
#include "model/model.h"

namespace serval::cli {

int cmd_lora(int argc, char** argv) {
  CLI::App app("LoRA adapters (llama.cpp's GGUF adapter format)", "serval lora");
  app.require_subcommand(1);
  std::string base_path, adapter_path, out;
  float scale = 1.0f;
  bool f16 = false;
  auto* merge = app.add_subcommand("merge", "write BASE with ADAPTER merged into its weights");
  merge->add_option("base", base_path, "base model GGUF")->required();
  merge->add_option("adapter", adapter_path, "LoRA adapter GGUF")->required();
  merge->add_option("output", out, "output GGUF")->required();
  merge->add_option("--scale", scale, "adapter scale (multiplies alpha / rank)")->check(CLI::Range(-100.0, 100.0));
  merge->add_flag("--f16", f16, "write the merged matrices as F16 (default F32; other tensors keep their type)");
  if (auto rc = parse(app, argc, argv)) return *rc;

  const std::string cmd = "serval lora merge";
  const auto t0 = std::chrono::steady_clock::now();
  auto base = Model::load(base_path);
  if (!base.ok()) return fail(cmd, base.status().message());
  auto adapter = LoraAdapter::load(adapter_path, **base, scale);
  if (!adapter.ok()) return fail(cmd, adapter.status().message());
  Status st = write_merged_model(**base, **adapter, out, f16);
  if (!st.ok()) return fail(cmd, st.message(), 1);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "%s: wrote %s (%zu matrices merged, rank %lld, scale %g) in %.1f s\n", cmd.c_str(), out.c_str(),
               (*adapter)->n_matrices(), (long long)(*adapter)->rank(), (double)(*adapter)->scale(), secs);
  return 0;
}

}  // namespace serval::cli
