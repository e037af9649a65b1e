// End-to-end tests of the `serval` binary: exit statuses, one-line errors, and
// generated text against llama.cpp's golden continuation.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sys/wait.h>

#include "cli_run.h"
#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"

using namespace serval_cli_test;

TEST(Cli, BadUsageIsOneLineAndStatus2) {
  expect_usage_error("", "usage");
  expect_usage_error("frobnicate", "unknown command 'frobnicate'");
  expect_usage_error("run -p hi", "--model");
  expect_usage_error("run -m " + kStories + " -p hi --top-k -3", "top-k");
  expect_usage_error("run -m " + kStories + " -p hi --bogus-flag", "bogus");
  expect_usage_error("run -m /nonexistent/model.gguf -p hi", "no such file");
  expect_usage_error("run -m " + kShared + "/DESIGN.md -p hi", "bad magic");
  expect_usage_error("run -m " + kStories + " -p hi --top-p 1.5", "top_p");
  expect_usage_error("run -m " + kStories + " -p hi --kv-type q9", "--kv-type");
  expect_usage_error("run -m " + kStories + " -p hi --kv-type q8_0", "multiple of 32");  // head_dim 8
  expect_usage_error("bench model -m " + kStories + " -p 16 -n 0 --kv-type q4_0", "multiple of 32");
  expect_usage_error("gguf info /nonexistent.gguf", "no such file");
  expect_usage_error("gguf synth --shape gpt-9 --vocab " + kStories + " -o /tmp/x.gguf", "unknown shape 'gpt-9'");
  expect_usage_error("gguf synth --shape tiny --type q9_9 --vocab " + kStories + " -o /tmp/x.gguf", "unknown type");
  expect_usage_error("gguf synth --shape tiny --arch mamba --vocab " + kStories + " -o /tmp/x.gguf",
                     "unknown architecture 'mamba'");
}

TEST(Cli, HelpExitsZero) {
  EXPECT_EQ(run("--help").status, 0);
  Result r = run("run --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("--top-k"), std::string::npos);
}

TEST(Cli, UnsupportedArchitectureIsRejected) {
  auto src = serval::gguf::GgufFile::open(kStories);
  ASSERT_TRUE(src.ok());
  serval::gguf::GgufWriter w;
  for (const auto& kv : src->metadata())
    w.add(kv.key, kv.key == "general.architecture" ? serval::gguf::Value("mamba") : kv.value);
  const std::string path = ::testing::TempDir() + "/serval_mamba.gguf";
  ASSERT_TRUE(w.write_file(path).ok());
  expect_usage_error("run -m " + path + " -p hi", "unsupported architecture 'mamba'");
  std::remove(path.c_str());
}

// Greedy `serval run` prints the prompt followed by exactly llama.cpp's
// detokenized greedy continuation.
TEST(Cli, GreedyRunPrintsGoldenText) {
  std::ifstream in(kShared + "/golden/stories260K-greedy.json");
  const auto golden = nlohmann::json::parse(in);
  const auto& c = golden["cases"][0];
  const std::string prompt = c["prompt"];
  Result r = run("run -m " + kStories + " -p '" + prompt + "' -n 200 --temp 0 -t 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, prompt + c["greedy_text"].get<std::string>() + "\n");
  EXPECT_NE(r.err.find("tok/s"), std::string::npos) << r.err;
}

TEST(Cli, SeededSamplingIsReproducible) {
  const std::string args = "run -m " + kStories + " -p 'Once upon a time' -n 40 --temp 0.9 --seed 1234";
  Result a = run(args), b = run(args + " -t 2"), c = run("run -m " + kStories + " -p 'Once upon a time' -n 40 --temp 0.9 --seed 99");
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(Cli, StopStringEndsGeneration) {
  // The golden continuation of "Once upon a time" contains "Lily."; stop there.
  Result r = run("run -m " + kStories + " -p 'Once upon a time' -n 200 --temp 0 --stop 'Lily.'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "Once upon a time, there was a little girl named \n");
  EXPECT_NE(r.err.find("finish: stop"), std::string::npos) << r.err;
}

TEST(Cli, GgufInfoAndSynth) {
  Result info = run("gguf info " + kStories);
  ASSERT_EQ(info.status, 0) << info.err;
  EXPECT_NE(info.out.find("llama.block_count"), std::string::npos);
  EXPECT_NE(info.out.find("blk.4.ffn_down.weight"), std::string::npos);

  const std::string path = ::testing::TempDir() + "/serval_cli_synth.gguf";
  Result s = run("gguf synth --shape tiny --type q4_0 --vocab " + kStories + " -o " + path);
  ASSERT_EQ(s.status, 0) << s.err;
  auto f = serval::gguf::GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type, serval::DType::q4_0);
  EXPECT_EQ(*f->get_uint("llama.embedding_length"), 256u);
  Result gen = run("run -m " + path + " -p 'Once upon a time' -n 8 --temp 0");
  EXPECT_EQ(gen.status, 0) << gen.err;
  EXPECT_NE(gen.err.find("generation: 8 tokens"), std::string::npos) << gen.err;
  std::remove(path.c_str());
}

// Every family synth writes loads and generates; its keys and tensors are the family's.
TEST(Cli, GgufSynthEveryFamily) {
  const std::string path = ::testing::TempDir() + "/serval_cli_synth_arch.gguf";
  for (const char* arch : {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"}) {
    Result s = run(std::string("gguf synth --shape tiny --arch ") + arch + " --type q8_0 --vocab " + kStories + " -o " + path);
    ASSERT_EQ(s.status, 0) << arch << ": " << s.err;
    auto f = serval::gguf::GgufFile::open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(*f->get_string("general.architecture"), arch);
    EXPECT_EQ(*f->get_uint(std::string(arch) + ".embedding_length"), 256u);
    const std::string a = arch;
    EXPECT_EQ(f->find_tensor("blk.0.attn_qkv.weight") != nullptr, a == "phi3") << arch;
    EXPECT_EQ(f->find_tensor("blk.0.attn_q_norm.weight") != nullptr, a == "qwen3" || a == "gemma3") << arch;
    EXPECT_EQ(f->find_tensor("blk.1.post_ffw_norm.weight") != nullptr, a == "gemma2" || a == "gemma3") << arch;
    EXPECT_EQ(f->find_tensor("blk.1.attn_v.bias") != nullptr, a == "qwen2") << arch;
    Result gen = run("run -m " + path + " -p 'Once upon a time' -n 8 --temp 0");
    EXPECT_EQ(gen.status, 0) << arch << ": " << gen.err;
    EXPECT_NE(gen.err.find("generation: 8 tokens"), std::string::npos) << arch << ": " << gen.err;
  }
  // A mixture-of-experts shape (16 experts, 4 used): expert tensors are 3-D, the router F32.
  Result s = run("gguf synth --shape qwen3moe-tiny --type q4_0 --vocab " + kStories + " -o " + path);
  ASSERT_EQ(s.status, 0) << s.err;
  auto f = serval::gguf::GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f->get_uint("qwen3moe.expert_count"), 16u);
  EXPECT_EQ(f->find_tensor("blk.0.ffn_down_exps.weight")->dims, (std::vector<int64_t>{128, 256, 16}));
  EXPECT_EQ(f->find_tensor("blk.0.ffn_gate_inp.weight")->type, serval::DType::f32);
  Result gen = run("run -m " + path + " -p 'Once upon a time' -n 8 --temp 0");
  EXPECT_EQ(gen.status, 0) << gen.err;
  expect_usage_error("gguf synth --shape tiny --arch qwen3moe --vocab " + kStories + " -o " + path, "has no experts");
  std::remove(path.c_str());
}

TEST(Cli, TokenizeIds) {
  Result r = run("tokenize -m " + kStories + " --ids 'Once upon a time'");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[403, 407, 261, 378]\n");
  Result b = run("tokenize -m " + kStories + " --ids --bos 'Once upon a time'");
  EXPECT_EQ(b.out, "[1, 403, 407, 261, 378]\n");
}

TEST(Cli, BenchModelJsonHasLlamaBenchFields) {
  Result r = run("bench model -m " + kStories + " -p 24 -n 6 -r 3 -t 1 -b 16 -o json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["n_prompt"], 24);
  EXPECT_EQ(j[0]["n_gen"], 0);
  EXPECT_EQ(j[1]["n_prompt"], 0);
  EXPECT_EQ(j[1]["n_gen"], 6);
  for (const auto& t : j) {
    ASSERT_EQ(t["samples_ts"].size(), 3u);
    double sum = 0;
    for (double v : t["samples_ts"]) {
      EXPECT_GT(v, 0.0);
      sum += v;
    }
    EXPECT_NEAR((double)t["avg_ts"], sum / 3, 1e-6 * sum);
    EXPECT_GE((double)t["stddev_ts"], 0.0);
    EXPECT_EQ(t["n_threads"], 1);
  }
  Result md = run("bench model -m " + kStories + " -p 8 -n 0 -r 1 -t 1");
  ASSERT_EQ(md.status, 0) << md.err;
  EXPECT_NE(md.out.find("| pp8 |"), std::string::npos) << md.out;
  expect_usage_error("bench model -m " + kStories + " -p 0 -n 0", "nothing to run");
  // At depth: the name and n_depth as llama-bench gives them; depth counts
  // against the model's context.
  Result d = run("bench model -m " + kStories + " -p 0 -n 4 -d 100 -r 1 -t 1 -o json");
  ASSERT_EQ(d.status, 0) << d.err;
  const auto dj = nlohmann::json::parse(d.out);
  ASSERT_EQ(dj.size(), 1u);
  EXPECT_EQ(dj[0]["n_depth"], 100);
  EXPECT_EQ(dj[0]["n_gen"], 4);
  Result dmd = run("bench model -m " + kStories + " -p 0 -n 4 -d 100 -r 1 -t 1");
  EXPECT_NE(dmd.out.find("| tg4 @ d100 |"), std::string::npos) << dmd.out;
  expect_usage_error("bench model -m " + kStories + " -p 0 -n 16 -d 1000000", "exceed the model's context");
}

// Speculative decoding from the CLI: greedy output unchanged with n-gram and
// draft-model speculation, the figures printed, bad flags refused in one line.
TEST(Cli, SpeculativeRunMatchesGoldenAndBenchReportsAcceptance) {
  std::ifstream in(kShared + "/golden/stories260K-greedy.json");
  const auto golden = nlohmann::json::parse(in);
  const auto& c = golden["cases"][0];
  const std::string prompt = c["prompt"];
  for (const std::string& spec : {std::string("--spec ngram --draft-max 3"), "--draft-model " + kStories}) {
    Result r = run("run -m " + kStories + " -p '" + prompt + "' -n 200 --temp 0 -t 1 " + spec);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, prompt + c["greedy_text"].get<std::string>() + "\n") << spec;
    EXPECT_NE(r.err.find("accepted"), std::string::npos) << r.err;
  }
  Result b = run("bench throughput -m " + kStories + " --spec ngram --requests 2 --gen-len 32 -t 1 -o json");
  ASSERT_EQ(b.status, 0) << b.err;
  const auto j = nlohmann::json::parse(b.out);
  EXPECT_GT(j["speculative"]["spec_draft_tokens"].get<int64_t>(), 0);
  EXPECT_EQ(j["baseline"]["spec_draft_tokens"].get<int64_t>(), 0);
  EXPECT_GT(j["gen_tok_s_ratio"].get<double>(), 0.0);

  expect_usage_error("run -m " + kStories + " -p hi --spec draft", "--draft-model");
  expect_usage_error("run -m " + kStories + " -p hi --spec magic", "--spec");
  expect_usage_error("run -m " + kStories + " -p hi --spec ngram --draft-max 0", "--draft-max");
  expect_usage_error("run -m " + kStories + " -p hi --spec ngram --ngram-min 5 --ngram-max 2", "--ngram-min");
  const std::string gpt2 = ::testing::TempDir() + "/serval_gpt2_draft.gguf";
  ASSERT_EQ(run("gguf synth --shape tiny --type q8_0 --vocab " + kShared +
                "/tokenizer-vectors/ggml-vocab-gpt-2.gguf -t 1 -o " + gpt2).status, 0);
  expect_usage_error("run -m " + kStories + " -p hi --draft-model " + gpt2, "vocabulary");
  std::remove(gpt2.c_str());
}

// bench throughput's decode-only steps: one request of G tokens after an
// 8-token prompt is one prefill step (the first token) and G - 1 steps of one
// decode token each; with two requests at once every decode-only step makes
// at most two tokens, and the steps that prefill are not among them.
TEST(Cli, BenchThroughputCountsDecodeOnlySteps) {
  Result one = run("bench throughput -m " + kStories + " --requests 1 --concurrency 1 --prompt-len 8 --gen-len 16 -t 1 -o json");
  ASSERT_EQ(one.status, 0) << one.err;
  const auto j1 = nlohmann::json::parse(one.out);
  EXPECT_EQ(j1["decode_steps"].get<int64_t>(), 15) << one.out;
  EXPECT_EQ(j1["decode_step_tokens"].get<int64_t>(), 15) << one.out;
  EXPECT_GT(j1["decode_step_tok_s"].get<double>(), 0.0);
  Result two = run("bench throughput -m " + kStories + " --requests 4 --concurrency 2 --prompt-len 8 --gen-len 16 -t 1 -o json");
  ASSERT_EQ(two.status, 0) << two.err;
  const auto j2 = nlohmann::json::parse(two.out);
  const int64_t steps = j2["decode_steps"], tokens = j2["decode_step_tokens"];
  EXPECT_GE(steps, 15) << two.out;
  EXPECT_LE(tokens, 2 * steps) << two.out;
  EXPECT_LT(tokens, j2["gen_tokens"].get<int64_t>()) << two.out;  // the first tokens come from prefill steps
}

TEST(Cli, SearchDecodingFlags) {
  // Beam search: --num-return hypotheses, each under a header with its score, best first.
  Result r = run("run -m " + kStories + " -p 'Once upon a time' -n 12 -t 1 --beam-width 4 --num-return 2");
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<double> scores;
  for (size_t at = r.out.find("(score "); at != std::string::npos; at = r.out.find("(score ", at + 1))
    scores.push_back(std::stod(r.out.substr(at + 7)));
  ASSERT_EQ(scores.size(), 2u) << r.out;
  EXPECT_GE(scores[0], scores[1]);
  EXPECT_NE(r.out.find("--- beam 2"), std::string::npos) << r.out;
  // Contrastive search is deterministic and differs from greedy decoding here.
  const std::string cs = "run -m " + kStories + " -p 'Once upon a time' -n 16 -t 1 --penalty-alpha 0.6 --top-k 4";
  Result a = run(cs), b = run(cs + " --temp 1.5"), g = run("run -m " + kStories + " -p 'Once upon a time' -n 16 --temp 0");
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, g.out);
  Result bad = run("run -m " + kStories + " -p 'x' -n 4 --beam-width 4 --num-beam-groups 3");
  EXPECT_NE(bad.status, 0);
  EXPECT_EQ(count_lines(bad.err), 1u) << bad.err;
  EXPECT_NE(bad.err.find("num_beam_groups"), std::string::npos) << bad.err;
}

// serval quantize / imatrix / perplexity end to end on stories260K (the text:
// Debian's GPL-3, present on every Debian system), and their refusals in one line.
TEST(Cli, QuantizeImatrixPerplexity) {
  const std::string dir = ::testing::TempDir() + "/serval_cli_q" + std::to_string(getpid());
  const std::string text = "/usr/share/common-licenses/GPL-3";
  const std::string im = dir + "_im.dat", q8 = dir + "_q8.gguf", q4 = dir + "_q4km.gguf", base = dir + "_base.kl";
  Result r = run("imatrix -m " + kStories + " -f " + text + " -o " + im + " --ctx 128 --chunks 2 -t 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("PPL:"), std::string::npos) << r.out;
  r = run("quantize " + kStories + " " + q4 + " q4_k_m --imatrix " + im + " -t 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(count_lines(r.err), 1u) << "no progress spam when stderr is not a terminal:\n" << r.err;
  EXPECT_NE(r.err.find("with imatrix"), std::string::npos) << r.err;
  auto f = serval::gguf::GgufFile::open(q4);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->get_uint("general.file_type").value(), 15u);
  EXPECT_EQ(f->get_string("quantize.imatrix.file").value(), im);
  ASSERT_EQ(run("quantize " + kStories + " " + q8 + " Q8_0 -t 1").status, 0);

  r = run("perplexity -m " + kStories + " -f " + text + " --ctx 128 --chunks 2 -t 1 --kl-divergence-base " + base);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("PPL:"), std::string::npos) << r.out;
  r = run("perplexity -m " + q8 + " --kl-divergence-base " + base + " --kl-divergence -t 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("Mean KLD:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Same top p:"), std::string::npos) << r.out;
  // The same F32 model with an F16 KV cache against its own F32-cache logits:
  // F16 rounding of K/V moves the distribution, but by far less than Q8_0 weights.
  r = run("perplexity -m " + kStories + " --kl-divergence-base " + base + " --kl-divergence -t 1 --kv-type f16");
  ASSERT_EQ(r.status, 0) << r.err;
  const size_t at = r.out.find("Mean KLD: ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const double kl_f16 = std::stod(r.out.substr(at + 10));
  EXPECT_GE(kl_f16, 0.0);
  EXPECT_LT(kl_f16, 1e-3) << r.out;

  expect_usage_error("perplexity -m " + kStories + " -f " + text + " --kv-type q8_0", "multiple of 32");
  expect_usage_error("quantize " + kStories + " " + dir + "_x.gguf Q9_9", "unknown type 'Q9_9' (valid: Q8_0");
  const std::string mini = kShared + "/models/mini/mini-llama-F16.gguf";
  expect_usage_error("quantize " + mini + " " + dir + "_x.gguf iq2_xs", "IQ2_XS needs an importance matrix");
  // ... and with one, the 1-bit mix is written and runs.
  const std::string iq1 = dir + "_iq1_m.gguf";
  r = run("quantize " + mini + " " + iq1 + " IQ1_M -t 2 --imatrix " + kShared + "/models/mini/mini-llama-F16.imatrix");
  ASSERT_EQ(r.status, 0) << r.err;
  r = run("run -m " + iq1 + " -p Hello -n 4 --temp 0");
  EXPECT_EQ(r.status, 0) << r.err;
  std::remove(iq1.c_str());
  expect_usage_error("quantize " + q8 + " " + dir + "_x.gguf Q4_0", "already quantized");
  expect_usage_error("quantize /nonexistent.gguf " + dir + "_x.gguf Q4_0", "no such file");
  expect_usage_error("quantize " + kStories + " " + dir + "_x.gguf Q4_0 --imatrix /nonexistent.dat", "no such file");
  expect_usage_error("quantize " + kStories + " " + dir + "_x.gguf Q4_0 --imatrix " + kStories, "GGUF imatrix");
  expect_usage_error("perplexity -m " + kStories, "--file");
  expect_usage_error("perplexity -m " + kStories + " -f /nonexistent.txt", "cannot read text file");
  expect_usage_error("perplexity -m " + kStories + " --kl-divergence", "--kl-divergence-base");
  expect_usage_error("perplexity -m " + kStories + " --kl-divergence --kl-divergence-base " + text, "bad magic");
  expect_usage_error("perplexity -m " + kStories + " -f " + kShared + "/DESIGN.md --ctx 4096", "context size");
  expect_usage_error("imatrix -m " + kStories + " -f " + text, "--output");
  for (const auto& p : {im, q8, q4, base}) std::remove(p.c_str());
}
