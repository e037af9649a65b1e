// `serval plan profile` and `serval plan` end to end on stories260K: a
// measured profile, predictions and recommendations that hold together, a
// trace in the access log's format, and one-line errors for bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_run.h"

using namespace serval_cli_test;

namespace {

// A file removed when the test program exits.
struct TempFile {
  std::string path;
  ~TempFile() { std::remove(path.c_str()); }
};

// One small profile for the whole suite (a second or two on stories260K).
const std::string& profile_path() {
  static const TempFile file{[] {
    const std::string p = ::testing::TempDir() + "/serval_plan_profile_" + std::to_string(getpid()) + ".json";
    Result r = run("plan profile -m " + kStories +
                   " -t 1 --max-batch 8 --max-chunk 64 --max-depth 256 -r 2 --no-roofline -o " + p);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_NE(r.err.find("decode"), std::string::npos) << r.err;
    return p;
  }()};
  return file.path;
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

}  // namespace

TEST(PlanCli, ProfileHoldsTheMeasuredPointsAndTheFit) {
  const auto j = nlohmann::json::parse(slurp(profile_path()));
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["model"]["arch"], "llama");
  EXPECT_EQ(j["machine"]["threads"], 1);
  EXPECT_EQ(j["kv"]["bytes_per_token"], 640);  // 5 layers x 2 x 64 (kv dim) x 2 bytes (f16)
  // Chunks of 1..64 tokens from position 0, and 2..64 deeper in; decode batches 1..8.
  int from0 = 0, deeper = 0;
  for (const auto& c : j["prefill"]) (c["start"] == 0 ? from0 : deeper) += 1;
  EXPECT_EQ(from0, 7);
  EXPECT_EQ(deeper, 6);
  EXPECT_GE(j["decode"].size(), 8u);
  EXPECT_EQ(j["engine"].size(), 2u);
  ASSERT_EQ(j["step_model"]["matmul"].size(), 7u);
  double prev = 0;
  for (const auto& m : j["step_model"]["matmul"]) {
    EXPECT_GE((double)m["seconds"], prev);  // non-decreasing in the tokens of a step
    prev = m["seconds"];
  }
}

TEST(PlanCli, PredictsAndRecommends) {
  Result r = run("plan -p " + profile_path() + " --rate 20 --prompt-len 32 --gen-len 16 --requests 50 -o json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  const auto& p = j["prediction"];
  EXPECT_EQ(p["completed"], 50);
  // Light load: completions keep up with arrivals.
  EXPECT_FALSE(p["saturated"]);
  EXPECT_GT((double)p["requests_per_s"], 10.0);
  EXPECT_LE((double)p["ttft_s"]["p50"], (double)p["ttft_s"]["p99"]);
  EXPECT_GT((double)p["itl_s"]["p50"], 0.0);
  const auto& rec = j["recommendation"];
  EXPECT_TRUE(rec["feasible"]);
  EXPECT_EQ(rec["replicas"], 1);
  EXPECT_GE((double)rec["max_rate_per_replica"], 20.0);

  // An ITL objective no decode step can meet: infeasible at any replica count, and it says why.
  Result no = run("plan -p " + profile_path() + " --rate 20 --prompt-len 32 --gen-len 16 --requests 50 "
                  "--slo-itl-p99 0.0000001 -o json");
  ASSERT_EQ(no.status, 0) << no.err;
  const auto nj = nlohmann::json::parse(no.out);
  EXPECT_FALSE(nj["recommendation"]["feasible"]);
  EXPECT_FALSE(nj["recommendation"]["binding"].get<std::string>().empty());

  // Text output names the settings to run.
  Result t = run("plan -p " + profile_path() + " --rate 20 --prompt-len 32 --gen-len 16 --requests 50");
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(t.out.find("serval serve --max-seqs"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("TTFT"), std::string::npos) << t.out;
}

TEST(PlanCli, TraceInTheAccessLogFormat) {
  const std::string trace = ::testing::TempDir() + "/serval_plan_trace.jsonl";
  // serve --log-format json lines: generation requests carry the token counts,
  // others (health checks) do not and are skipped.
  write(trace,
        "{\"msg\":\"request\",\"path\":\"/v1/completions\",\"status\":200,\"prompt_tokens\":40,\"completion_tokens\":20}\n"
        "{\"msg\":\"request\",\"path\":\"/health\",\"status\":200}\n"
        "\n"
        "{\"prompt_len\":100,\"gen_len\":8}\n"
        "{\"msg\":\"request\",\"path\":\"/v1/chat/completions\",\"status\":200,\"prompt_tokens\":12,\"completion_tokens\":30}\n");
  Result r = run("plan -p " + profile_path() + " --rate 10 --trace " + trace + " --requests 40 -o json");
  ASSERT_EQ(r.status, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["workload"]["length_samples"], 3);
  EXPECT_EQ(j["prediction"]["completed"], 40);

  write(trace, "{\"prompt_len\":10,\"gen_len\":5}\n{not json\n");
  expect_usage_error("plan -p " + profile_path() + " --rate 10 --trace " + trace, "line 2");
  write(trace, "{\"prompt_len\":10.5,\"gen_len\":5}\n");
  expect_usage_error("plan -p " + profile_path() + " --rate 10 --trace " + trace, "integers");
  write(trace, "{\"msg\":\"request\",\"path\":\"/health\"}\n");
  expect_usage_error("plan -p " + profile_path() + " --rate 10 --trace " + trace, "no line with prompt");
  std::remove(trace.c_str());
}

TEST(PlanCli, BadInputIsOneLineAndStatus2) {
  const std::string p = profile_path();
  const std::string base = "plan -p " + p + " ";
  expect_usage_error(base + "--rate 0 --prompt-len 10 --gen-len 10", "--rate");
  expect_usage_error(base + "--rate -2 --prompt-len 10 --gen-len 10", "--rate");
  expect_usage_error(base + "--rate x --prompt-len 10 --gen-len 10", "--rate");
  expect_usage_error(base + "--rate 1 --prompt-len 0 --gen-len 10", "--prompt-len");
  expect_usage_error(base + "--rate 1 --prompt-len 10", "--gen-len");
  expect_usage_error(base + "--rate 1 --prompt-len 2000 --gen-len 100", "exceed the context");
  expect_usage_error(base + "--rate 1 --prompt-len 10 --gen-len 10 --ctx 100000", "--ctx");
  expect_usage_error(base + "--rate 1 --prompt-len 10 --gen-len 10 --requests 0", "--requests");
  expect_usage_error(base + "--rate 1 --prompt-len 10 --gen-len 10 --kv-memory 1K", "--kv-memory");
  expect_usage_error(base + "--rate 1 --prompt-len 10 --gen-len 10 --trace /nonexistent.jsonl", "one of the two");
  expect_usage_error(base + "--rate 1 --trace /nonexistent/trace.jsonl", "cannot read");
  expect_usage_error(base + "--rate 1 --prompt-len 10 --gen-len 10 --validate", "--url");
  expect_usage_error(base + "--rate 1 --prompt-len 10 --gen-len 10 --url http://127.0.0.1:1", "--validate");
  expect_usage_error("plan --rate 1 --prompt-len 10 --gen-len 10", "--profile");
  expect_usage_error("plan -p /nonexistent/profile.json --rate 1 --prompt-len 10 --gen-len 10", "cannot read profile");
  const std::string bad = ::testing::TempDir() + "/serval_plan_bad_profile.json";
  write(bad, "{\"version\": 1, ");
  expect_usage_error("plan -p " + bad + " --rate 1 --prompt-len 10 --gen-len 10", "not valid JSON");
  auto j = nlohmann::json::parse(slurp(p));
  j["kv"]["bytes_per_token"] = -5;
  write(bad, j.dump());
  expect_usage_error("plan -p " + bad + " --rate 1 --prompt-len 10 --gen-len 10", "kv.bytes_per_token");
  write(bad, std::string(100, '[') + std::string(100, ']'));
  expect_usage_error("plan -p " + bad + " --rate 1 --prompt-len 10 --gen-len 10", "nests deeper");
  std::remove(bad.c_str());
  expect_usage_error("plan profile", "--model");
  expect_usage_error("plan profile -m /nonexistent.gguf", "nonexistent");
  expect_usage_error("plan profile -m " + kStories + " -o /nonexistent/dir/p.json", "cannot write");
  expect_usage_error("plan profile -m " + kStories + " --max-chunk 1", "--max-chunk");
}
