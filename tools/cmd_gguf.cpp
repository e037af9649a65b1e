// serval gguf info FILE | serval gguf synth --shape NAME --type TYPE --vocab VOCAB -o OUT [--pooling P]
#include <chrono>
#include <cstdio>

#include "cli_util.h"
#include "commands.h"
#include "common/thread_pool.h"
#include "gguf/gguf_reader.h"
#include "model/synthetic.h"

namespace serval::cli {
namespace {

int gguf_info(const std::string& path, bool all_values) {
  auto f = gguf::GgufFile::open(path);
  if (!f.ok()) return fail("serval gguf info", f.status().message());
  std::printf("file: %s\nversion: %u\nalignment: %u\nsize: %zu bytes\ndata offset: %llu\n", path.c_str(),
              f->version(), f->alignment(), f->file_size(), (unsigned long long)f->data_offset());
  std::printf("\nmetadata (%zu keys):\n", f->metadata().size());
  for (const auto& kv : f->metadata())
    std::printf("  %-45s %-7s %s\n", kv.key.c_str(), std::string(gguf::value_type_name(kv.value.type())).c_str(),
                gguf::value_to_string(kv.value, all_values ? (size_t)-1 : 8).c_str());
  uint64_t total = 0, params = 0;
  std::printf("\ntensors (%zu):\n", f->tensors().size());
  for (const auto& t : f->tensors()) {
    std::string shape;
    for (size_t i = 0; i < t.dims.size(); ++i) shape += (i ? " x " : "") + std::to_string(t.dims[i]);
    std::printf("  %-36s %-8s %-22s %12llu bytes @ %llu\n", t.name.c_str(), std::string(dtype_name(t.type)).c_str(),
                shape.c_str(), (unsigned long long)t.n_bytes, (unsigned long long)t.offset);
    total += t.n_bytes;
    params += t.n_elements;
  }
  std::printf("\n%llu parameters, %.2f MiB of tensor data (%.2f bits per weight)\n", (unsigned long long)params,
              (double)total / (1024.0 * 1024.0), params ? 8.0 * (double)total / (double)params : 0.0);
  return 0;
}

int gguf_synth(const std::string& shape_name, const std::string& arch, const std::string& type_name,
               const std::string& vocab_path, const std::string& out, uint64_t seed, int threads,
               const std::string& pooling) {
  const std::string cmd = "serval gguf synth";
  auto shape = find_synth_shape(shape_name);
  if (!shape.ok()) return fail(cmd, shape.status().message());
  const bool q4_k_m = type_name == "q4_k_m";
  auto type = q4_k_m ? std::optional<DType>(DType::q4_k) : dtype_from_name(type_name);
  if (!type) return fail(cmd, "unknown type '" + type_name + "' (e.g. f16, bf16, q8_0, q4_0, q4_k, q4_k_m, q6_k)");
  auto vocab = gguf::GgufFile::open(vocab_path);
  if (!vocab.ok()) return fail(cmd, vocab.status().message());
  ThreadPool pool(threads > 0 ? threads : ThreadPool::default_threads());
  const auto t0 = std::chrono::steady_clock::now();
  SynthOptions opt;
  opt.shape = *shape;
  opt.arch = arch;
  opt.type = *type;
  opt.seed = seed;
  opt.q4_k_m = q4_k_m;
  opt.pooling = pooling;
  Status st = write_synthetic_model(opt, *vocab, out, &pool);
  if (!st.ok()) return fail(cmd, st.message(), st.code() == StatusCode::io_error ? 1 : 2);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "%s: wrote %s (%s, %s, %s) in %.1f s\n", cmd.c_str(), out.c_str(), shape_name.c_str(),
               (arch.empty() ? shape->arch : arch).c_str(),
               q4_k_m ? "q4_k_m" : std::string(dtype_name(*type)).c_str(), secs);
  return 0;
}

}  // namespace

int cmd_gguf(int argc, char** argv) {
  CLI::App app("Inspect or synthesize GGUF files", "serval gguf");
  app.require_subcommand(1);
  std::string info_path;
  bool all_values = false;
  auto* info = app.add_subcommand("info", "print metadata and tensors of a GGUF file");
  info->add_option("file", info_path, "GGUF file")->required();
  info->add_flag("--all", all_values, "print arrays in full");

  std::string shape, arch, type = "f16", vocab, out, pooling;
  uint64_t seed = 42;
  int threads = 0;
  std::string shapes;
  for (const auto& s : synth_shapes()) shapes += (shapes.empty() ? "" : ", ") + s.name;
  std::string archs;
  for (const auto& a : synth_archs()) archs += (archs.empty() ? "" : ", ") + a;
  auto* synth = app.add_subcommand("synth", "write a GGUF of any family with seeded random weights at a real shape");
  synth->add_option("--shape", shape, "model shape: " + shapes)->required();
  synth->add_option("--arch", arch, "family: " + archs + " (default: the shape's own)");
  synth->add_option("--type", type, "weight type (f32, f16, bf16, q8_0, q4_0, q4_k, q4_k_m (llama.cpp's mix), q6_k, ...)");
  synth->add_option("--vocab", vocab, "vocab-only GGUF whose tokenizer the model takes")->required();
  synth->add_option("-o,--output", out, "output file")->required();
  synth->add_option("--seed", seed, "random seed");
  synth->add_option("--pooling", pooling, "encoders: pooling_type mean (default), cls, or rank (a reranker: adds the classification head)");
  synth->add_option("-t,--threads", threads, "threads (default: physical cores)")->check(CLI::Range(0, 1024));

  SynthLoraOptions lo;
  std::string lora_base, lora_out, lora_type = "f32";
  auto* synth_lora = app.add_subcommand(
      "synth-lora", "write a random LoRA adapter (llama.cpp's GGUF adapter format) for a base model file");
  synth_lora->add_option("--base", lora_base, "the base model GGUF")->required();
  synth_lora->add_option("-o,--output", lora_out, "output file")->required();
  synth_lora->add_option("--rank", lo.rank, "rank")->check(CLI::Range(1, 4096));
  synth_lora->add_option("--alpha", lo.alpha, "adapter.lora.alpha (scale = alpha / rank)")->check(CLI::Range(0.0, 1e6));
  synth_lora->add_option("--std-b", lo.std_b, "standard deviation of lora_b")->check(CLI::Range(0.0, 10.0));
  synth_lora->add_option("--targets", lo.targets,
                         "matrices: attn_q attn_k attn_v attn_output ffn_gate ffn_up ffn_down output (default: all "
                         "but output)")
      ->check(CLI::IsMember({"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "output"}));
  synth_lora->add_option("--type", lora_type, "f32 or f16")->check(CLI::IsMember({"f32", "f16"}));
  synth_lora->add_option("--seed", lo.seed, "random seed");

  if (auto rc = parse(app, argc, argv)) return *rc;
  if (*info) return gguf_info(info_path, all_values);
  if (*synth_lora) {
    const std::string cmd = "serval gguf synth-lora";
    auto base = gguf::GgufFile::open(lora_base);
    if (!base.ok()) return fail(cmd, base.status().message());
    lo.type = lora_type == "f16" ? DType::f16 : DType::f32;
    Status st = write_synthetic_lora(lo, *base, lora_out);
    if (!st.ok()) return fail(cmd, st.message(), st.code() == StatusCode::io_error ? 1 : 2);
    std::fprintf(stderr, "%s: wrote %s (rank %lld, alpha %g)\n", cmd.c_str(), lora_out.c_str(), (long long)lo.rank,
                 (double)lo.alpha);
    return 0;
  }
  return gguf_synth(shape, arch, type, vocab, out, seed, threads, pooling);
}

}  // namespace serval::cli
