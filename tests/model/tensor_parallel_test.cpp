// Tensor-parallel shards (model/tensor_parallel.h) against the whole model:
// N shards run the batched forward in N threads, meeting in an in-process
// all-gather, and must give the whole model's logits bit for bit, on every
// file (F32, F16 and 8-bit activations alike).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "model/batch_forward.h"
#include "model/tensor_parallel.h"

using namespace serval;

namespace {

const std::string kShared = SERVAL_SHARED_DIR;

// All-gather among threads: each rank posts its buffer, then every rank copies
// all of them in rank order. Two generations of barrier keep a rank from
// overwriting its buffer before the others have read it.
class ThreadCollective {
 public:
  explicit ThreadCollective(int n) : n_(n), bufs_((size_t)n) {}

  class Rank : public Collective {
   public:
    Rank(ThreadCollective* c, int r) : c_(c), r_(r) {}
    Status allgather(const float* in, size_t n, float* out) override { return c_->gather(r_, in, n, out); }

   private:
    ThreadCollective* c_;
    int r_;
  };

  Status gather(int rank, const float* in, size_t n, float* out) {
    bufs_[(size_t)rank] = in;
    barrier();
    for (int r = 0; r < n_; ++r) std::copy(bufs_[(size_t)r], bufs_[(size_t)r] + n, out + (size_t)r * n);
    barrier();
    return {};
  }

 private:
  void barrier() {
    std::unique_lock<std::mutex> lk(mu_);
    const int64_t gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
    } else {
      cv_.wait(lk, [&] { return gen_ != gen; });
    }
  }
  int n_;
  std::vector<const float*> bufs_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t gen_ = 0;
};

struct Runner {
  std::unique_ptr<Model> model;
  std::unique_ptr<KvStorage> kv;
  std::unique_ptr<BatchForward> fwd;
};

Runner make(const std::string& path, TensorParallel tp) {
  Runner r;
  auto m = Model::load(path, tp);
  EXPECT_TRUE(m.ok()) << m.status().message();
  r.model = std::move(m.value());
  const auto& c = r.model->config();
  auto kv = KvStorage::create({(int32_t)c.n_layers, (int32_t)c.kv_dim(), 16}, 8);
  EXPECT_TRUE(kv.ok());
  r.kv = std::make_unique<KvStorage>(std::move(kv.value()));
  r.fwd = std::make_unique<BatchForward>(*r.model, *r.kv, nullptr);
  return r;
}

std::vector<double> log_softmax(const float* l, int64_t n) {
  double mx = *std::max_element(l, l + n), sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp((double)l[i] - mx);
  std::vector<double> o((size_t)n);
  for (int64_t i = 0; i < n; ++i) o[(size_t)i] = (double)l[i] - mx - std::log(sum);
  return o;
}

// Prefill of `prompt` (logits at every position), then `n_gen` greedy steps;
// returns every logits row, in order. With shards: all of them run each batch
// in their own threads, and rank 0's rows are returned (every rank's must be
// the same bits).
std::vector<std::vector<float>> run(std::vector<Runner>& ranks, const std::vector<TokenId>& prompt, int n_gen) {
  std::vector<BlockId> table = {3, 6};
  std::vector<std::vector<float>> rows;
  auto step = [&](const Batch& b) {
    std::vector<std::vector<float>> out(ranks.size());
    std::vector<std::thread> th;
    std::vector<Status> st(ranks.size());
    for (size_t r = 0; r < ranks.size(); ++r)
      th.emplace_back([&, r] { st[r] = ranks[r].fwd->forward(b, &out[r]); });
    for (auto& t : th) t.join();
    for (size_t r = 0; r < ranks.size(); ++r) {
      EXPECT_TRUE(st[r].ok()) << st[r].message();
      EXPECT_EQ(out[r], out[0]) << "rank " << r << " differs from rank 0";
    }
    return out[0];
  };
  const int64_t nv = ranks[0].model->config().n_vocab;
  Batch b;
  b.tokens = prompt;
  b.seqs.push_back({0, (int32_t)prompt.size(), table, true, (int32_t)prompt.size()});
  std::vector<float> l = step(b);
  for (size_t i = 0; i < prompt.size(); ++i) rows.emplace_back(l.begin() + (long)(i * nv), l.begin() + (long)((i + 1) * nv));
  int64_t pos = (int64_t)prompt.size();
  for (int g = 0; g < n_gen; ++g, ++pos) {
    const std::vector<float>& last = rows.back();
    const TokenId t = (TokenId)(std::max_element(last.begin(), last.end()) - last.begin());
    Batch d;
    d.tokens = {t};
    d.seqs.push_back({pos, 1, table, true});
    rows.push_back(step(d));
  }
  return rows;
}

}  // namespace

TEST(TensorParallel, ShardsMatchTheWholeModel) {
  const std::vector<TokenId> prompt = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317};
  for (const char* file : {"stories260K.gguf", "mini/mini-llama-F16.gguf", "mini/mini-llama-Q4_0.gguf",
                           "mini/mini-llama-Q8_0.gguf", "mini/mini-llama-Q4_K_M.gguf", "mini/mini-qwen2-Q8_0.gguf",
                           "mini/mini-qwen2-Q4_K_M.gguf", "arch/mini-llama3-F16.gguf", "arch/mini-qwen3-F16.gguf",
                           "arch/mini-gemma3-F16.gguf", "arch/mini-phi3-F16.gguf"}) {
    SCOPED_TRACE(file);
    const std::string path = kShared + "/models/" + file;
    std::vector<Runner> whole;
    whole.push_back(make(path, {}));
    const auto want = run(whole, prompt, 12);
    for (int32_t n : {2, 4}) {
      SCOPED_TRACE("tp " + std::to_string(n));
      if (!tensor_parallel_refusal(whole[0].model->config(), whole[0].model->weights(), n).empty()) continue;
      ThreadCollective coll(n);
      std::vector<ThreadCollective::Rank> links;
      for (int r = 0; r < n; ++r) links.emplace_back(&coll, r);
      std::vector<Runner> shards;
      for (int r = 0; r < n; ++r) {
        shards.push_back(make(path, {r, n}));
        shards.back().fwd->set_collective(&links[(size_t)r]);
        EXPECT_EQ(shards.back().model->config().n_heads * n, whole[0].model->config().n_heads);
      }
      const auto got = run(shards, prompt, 12);
      ASSERT_EQ(got.size(), want.size());
      const int64_t nv = whole[0].model->config().n_vocab;
      // Every position's largest |difference| of log-probabilities.
      std::vector<double> rows;
      for (size_t i = 0; i < want.size(); ++i) {
        const auto a = log_softmax(want[i].data(), nv), b = log_softmax(got[i].data(), nv);
        double row = 0;
        for (int64_t v = 0; v < nv; ++v) row = std::max(row, std::fabs(a[(size_t)v] - b[(size_t)v]));
        rows.push_back(row);
        EXPECT_EQ(std::max_element(want[i].begin(), want[i].end()) - want[i].begin(),
                  std::max_element(got[i].begin(), got[i].end()) - got[i].begin())
            << "greedy token at row " << i;
      }
      std::vector<double> sorted = rows;
      std::sort(sorted.begin(), sorted.end());
      const double max_lp = sorted.back(), median = sorted[sorted.size() / 2];
      // Every projection sees its whole input and sums over all its columns in
      // the kernels' order: the logits are the whole model's bits.
      for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "logits of row " << i << " differ";
      EXPECT_EQ(max_lp, 0.0);
      RecordProperty(std::string(file) + " tp" + std::to_string(n) + " max |dlogprob|", std::to_string(max_lp));
      std::printf("%-32s tp %d: median %.2g, max %.2g |d logprob| over %zu positions\n", file, n, median, max_lp,
                  rows.size());
    }
  }
}

TEST(TensorParallel, RefusesWhatItCannotSplit) {
  auto m = Model::load(kShared + "/models/stories260K.gguf");
  ASSERT_TRUE(m.ok());
  const auto& c = (*m)->config();
  const auto& w = (*m)->weights();
  EXPECT_EQ(tensor_parallel_refusal(c, w, 1), "");
  EXPECT_EQ(tensor_parallel_refusal(c, w, 2), "");
  EXPECT_NE(tensor_parallel_refusal(c, w, 3).find("attention.head_count (8) is not a multiple"), std::string::npos);
  EXPECT_NE(tensor_parallel_refusal(c, w, 8).find("attention.head_count_kv (4)"), std::string::npos);
  auto bad = Model::load(kShared + "/models/stories260K.gguf", {0, 3});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("not a multiple of the tensor-parallel size 3"), std::string::npos);
  // Row slices only: K-quant blocks never constrain the split (mini-llama
  // Q4_K_M's 1536 FFN columns split 4 ways are 384, not a multiple of 256).
  auto q4k = Model::load(kShared + "/models/mini/mini-llama-Q4_K_M.gguf");
  ASSERT_TRUE(q4k.ok());
  EXPECT_EQ(tensor_parallel_refusal((*q4k)->config(), (*q4k)->weights(), 4), "");
  // A shard's forward without its all-gather is an error, not a wrong answer.
  auto shard = Model::load(kShared + "/models/stories260K.gguf", {0, 2});
  ASSERT_TRUE(shard.ok());
  auto kv = KvStorage::create({(int32_t)(*shard)->config().n_layers, (int32_t)(*shard)->config().kv_dim(), 16}, 2);
  ASSERT_TRUE(kv.ok());
  BatchForward fwd(**shard, *kv, nullptr);
  Batch b;
  b.tokens = {1};
  std::vector<BlockId> table = {0};
  b.seqs.push_back({0, 1, table, true});
  std::vector<float> logits;
  const Status st = fwd.forward(b, &logits);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("all-gather"), std::string::npos) << st.message();
}
