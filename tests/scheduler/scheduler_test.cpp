// Scheduler decisions for scripted arrivals: chunked prefill, budget, sequence
// cap, priorities and aging, preemption (recompute and swap) and resume, fork
// with copy-on-write, cancel in every state. Each step is summarized as
// "seq:start+n" per scheduled seq ('*' = needs logits), decodes first.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "kv_cache/kv_cache_manager.h"
#include "scheduler/scheduler.h"

namespace serval {
namespace {

using Toks = std::vector<TokenId>;
using Ids = std::vector<BlockId>;
using Swaps = std::vector<BlockSwap>;

Toks range(TokenId from, int n) {
  Toks v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::string brief(const SchedulerOutput& out) {
  std::ostringstream os;
  for (size_t i = 0; i < out.seqs.size(); ++i) {
    const ScheduledSeq& s = out.seqs[i];
    os << (i ? " " : "") << s.seq << ":" << s.start_pos << "+" << s.n_tokens << (s.needs_logits ? "*" : "");
  }
  return os.str();
}

SeqRequest req(SeqId id, Toks prompt, int64_t max_total, int32_t priority = 0, PrefixKey key = {}) {
  SeqRequest r;
  r.seq = id;
  r.prompt = std::move(prompt);
  r.max_total_tokens = max_total;
  r.priority = priority;
  r.prefix_key = key;
  return r;
}

struct Harness {
  std::unique_ptr<KvCacheManager> kv;
  std::unique_ptr<Scheduler> s;

  Harness(int32_t n_blocks, int32_t block_size, SchedulerConfig sc, int32_t n_host = 0) {
    KvCacheConfig kc;
    kc.n_blocks = n_blocks;
    kc.block_size = block_size;
    kc.n_host_blocks = n_host;
    kv = std::make_unique<KvCacheManager>(kc);
    s = std::make_unique<Scheduler>(sc, kv.get());
  }

  void add(SeqRequest r) { ASSERT_TRUE(s->add(std::move(r)).ok()); }

  // One engine step: schedule, "run", and sample token 1000 + step for every
  // seq whose chunk needs logits.
  SchedulerOutput step() {
    SchedulerOutput out = s->schedule();
    check(out);
    std::vector<std::pair<SeqId, TokenId>> sampled;
    for (const ScheduledSeq& ss : out.seqs)
      if (ss.needs_logits) sampled.push_back({ss.seq, static_cast<TokenId>(1000 + out.step)});
    s->update(out, sampled);
    return out;
  }

  // Invariants of every output.
  void check(const SchedulerOutput& out) const {
    const SchedulerConfig& c = s->config();
    int32_t sum = 0;
    for (const ScheduledSeq& ss : out.seqs) {
      sum += ss.n_tokens + ss.n_draft;
      EXPECT_GE(ss.n_tokens, 1);
      EXPECT_EQ(static_cast<int32_t>(ss.tokens.size()), ss.n_tokens);
      EXPECT_GE(static_cast<int64_t>(ss.block_table.size()) * kv->block_size(),
                ss.start_pos + ss.n_tokens + ss.n_draft);
      if (ss.n_draft > 0) {
        EXPECT_TRUE(ss.n_tokens == 1 && ss.needs_logits);
      }
    }
    EXPECT_EQ(sum, out.n_tokens);
    if (!out.preempted.empty() || !out.swap_out.empty()) {
      EXPECT_FALSE(out.seqs.empty());
    }
    if (!out.preempted.empty()) {
      EXPECT_TRUE(out.swap_in.empty());
    }
    EXPECT_LE(out.n_tokens, c.max_batch_tokens);
    EXPECT_LE(static_cast<int32_t>(out.seqs.size()), c.max_seqs);
  }

  Ids table(SeqId id) const {
    auto t = kv->block_table(id);
    return {t.begin(), t.end()};
  }
};

SchedulerConfig config(int32_t budget, int32_t max_seqs = 64) {
  SchedulerConfig c;
  c.max_batch_tokens = budget;
  c.max_seqs = max_seqs;
  c.max_model_len = 4096;
  return c;
}

TEST(Scheduler, ValidateConfig) {
  EXPECT_TRUE(Scheduler::validate(SchedulerConfig{}).ok());
  SchedulerConfig c;
  c.max_batch_tokens = 0;
  EXPECT_EQ(Scheduler::validate(c).code(), StatusCode::invalid_argument);
  c = {};
  c.max_seqs = 0;
  EXPECT_EQ(Scheduler::validate(c).code(), StatusCode::invalid_argument);
  c = {};
  c.aging_per_step = -1;
  EXPECT_EQ(Scheduler::validate(c).code(), StatusCode::invalid_argument);
}

TEST(Scheduler, AddRejectsWhatCouldNeverRun) {
  Harness h(4, 16, config(64));  // 64 token positions
  auto code = [&](SeqRequest r) { return h.s->add(std::move(r)).code(); };
  EXPECT_EQ(code(req(1, {}, 8)), StatusCode::invalid_argument);              // empty prompt
  EXPECT_EQ(code(req(1, range(1, 8), 8)), StatusCode::invalid_argument);     // no room to generate
  EXPECT_EQ(code(req(1, range(1, 8), 5000)), StatusCode::invalid_argument);  // > max_model_len
  EXPECT_EQ(code(req(1, range(1, 8), 66)), StatusCode::invalid_argument);    // 65 positions > pool
  EXPECT_EQ(code(req(1, range(1, 8), 65)), StatusCode::ok);                  // 64 positions fit
  EXPECT_EQ(code(req(1, range(1, 8), 16)), StatusCode::invalid_argument);    // duplicate id
  EXPECT_EQ(h.s->n_waiting(), 1u);

  SchedulerConfig nc = config(16);
  nc.enable_chunked_prefill = false;
  Harness g(16, 16, nc);
  EXPECT_EQ(g.s->add(req(1, range(1, 8), 18)).code(), StatusCode::invalid_argument);  // 17 > budget
  EXPECT_EQ(g.s->add(req(1, range(1, 8), 17)).code(), StatusCode::ok);
}

TEST(Scheduler, ChunkedPrefillSplits100TokensUnderBudget32) {
  Harness h(64, 16, config(32));
  h.add(req(1, range(1, 100), 110));
  EXPECT_EQ(brief(h.step()), "1:0+32");
  EXPECT_EQ(brief(h.step()), "1:32+32");
  EXPECT_EQ(brief(h.step()), "1:64+32");
  EXPECT_EQ(brief(h.step()), "1:96+4*");
  EXPECT_EQ(brief(h.step()), "1:100+1*");
  EXPECT_EQ(h.s->tokens(1).size(), 102u);
  EXPECT_EQ(h.s->num_computed(1), 101);
}

TEST(Scheduler, DecodeGetsItsTokenEveryStepWhileAPromptIsChunked) {
  Harness h(64, 16, config(33));
  h.add(req(1, range(1, 8), 64));
  EXPECT_EQ(brief(h.step()), "1:0+8*");
  h.add(req(2, range(100, 100), 120));
  EXPECT_EQ(brief(h.step()), "1:8+1* 2:0+32");
  EXPECT_EQ(brief(h.step()), "1:9+1* 2:32+32");
  EXPECT_EQ(brief(h.step()), "1:10+1* 2:64+32");
  EXPECT_EQ(brief(h.step()), "1:11+1* 2:96+4*");
  EXPECT_EQ(brief(h.step()), "1:12+1* 2:100+1*");
}

TEST(Scheduler, OutputCarriesTokensAndBlockTables) {
  Harness h(16, 4, config(64));
  h.add(req(1, range(10, 6), 20));
  SchedulerOutput o = h.step();
  ASSERT_EQ(o.seqs.size(), 1u);
  EXPECT_EQ(o.step, 0u);
  EXPECT_EQ(o.seqs[0].tokens, range(10, 6));
  EXPECT_EQ(o.seqs[0].block_table, (Ids{0, 1}));
  EXPECT_EQ(o.n_tokens, 6);
  EXPECT_EQ(h.s->tokens(1), (Toks{10, 11, 12, 13, 14, 15, 1000}));
  o = h.step();
  EXPECT_EQ(o.step, 1u);
  EXPECT_EQ(o.seqs[0].tokens, (Toks{1000}));
  EXPECT_EQ(o.seqs[0].start_pos, 6);
  EXPECT_EQ(o.seqs[0].block_table, (Ids{0, 1}));
  EXPECT_TRUE(o.copies.empty() && o.swap_in.empty() && o.swap_out.empty() && o.preempted.empty());
}

TEST(Scheduler, SequenceCap) {
  Harness h(64, 4, config(64, /*max_seqs=*/2));
  h.add(req(1, range(1, 4), 20));
  h.add(req(2, range(11, 4), 20));
  h.add(req(3, range(21, 4), 20));
  EXPECT_EQ(brief(h.step()), "1:0+4* 2:0+4*");
  EXPECT_EQ(h.s->n_waiting(), 1u);
  EXPECT_EQ(brief(h.step()), "1:4+1* 2:4+1*");
  h.s->finish(1);
  EXPECT_EQ(brief(h.step()), "2:5+1* 3:0+4*");
  EXPECT_EQ(h.s->n_running(), 2u);
  EXPECT_EQ(h.s->n_waiting(), 0u);
}

TEST(Scheduler, TokenBudgetLimitsDecodesToTheMostImportant) {
  Harness h(64, 4, config(2));
  h.add(req(1, range(1, 1), 20, /*priority=*/1));
  h.add(req(2, range(11, 1), 20, 0));
  h.add(req(3, range(21, 1), 20, 0));
  EXPECT_EQ(brief(h.step()), "2:0+1* 3:0+1*");
  EXPECT_EQ(brief(h.step()), "2:1+1* 3:1+1*");  // seq 1 waits: the budget is spent
  h.s->finish(3);
  EXPECT_EQ(brief(h.step()), "2:2+1* 1:0+1*");
}

TEST(Scheduler, PriorityThenFcfs) {
  Harness h(64, 4, config(64, /*max_seqs=*/1));
  h.add(req(1, range(1, 4), 20, 1));
  h.add(req(2, range(11, 4), 20, 0));
  h.add(req(3, range(21, 4), 20, 0));
  h.add(req(4, range(31, 4), 20, 1));
  std::vector<SeqId> order;
  for (int i = 0; i < 4; ++i) {
    SchedulerOutput o = h.step();
    ASSERT_EQ(o.seqs.size(), 1u);
    order.push_back(o.seqs[0].seq);
    h.s->finish(o.seqs[0].seq);
  }
  EXPECT_EQ(order, (std::vector<SeqId>{2, 3, 1, 4}));
  EXPECT_FALSE(h.s->has_unfinished());
}

// A priority-5 request competes with a new priority-0 request every step and
// one seq runs at a time: strict priority starves it, aging 1/step admits it
// once its effective priority 5 - steps_waited ties with the newcomers' 0.
TEST(Scheduler, AgingPreventsStarvation) {
  for (double aging : {0.0, 1.0}) {
    SchedulerConfig c = config(64, /*max_seqs=*/1);
    c.aging_per_step = aging;
    Harness h(64, 4, c);
    h.add(req(1, range(1, 4), 20, /*priority=*/5));
    int admitted_at = -1;
    for (int step = 0; step < 20 && admitted_at < 0; ++step) {
      h.add(req(100 + step, range(100, 4), 20, 0));
      SchedulerOutput o = h.step();
      ASSERT_EQ(o.seqs.size(), 1u);
      if (o.seqs[0].seq == 1) admitted_at = step;
      h.s->finish(o.seqs[0].seq);
    }
    EXPECT_EQ(admitted_at, aging == 0.0 ? -1 : 5) << "aging " << aging;
  }
}

// Three running decodes, a budget of two: strict priority always leaves out
// the latest; with aging the one left out moves ahead next step.
TEST(Scheduler, AgingRotatesRunningSeqsUnderTheBudget) {
  for (double aging : {0.0, 1.0}) {
    SchedulerConfig c = config(2);
    c.aging_per_step = aging;
    Harness h(16, 4, c);
    h.add(req(1, range(1, 1), 40));
    EXPECT_EQ(brief(h.step()), "1:0+1*");
    h.s->fork(1, 2, 7);
    h.s->fork(1, 3, 8);
    std::vector<std::string> steps;
    for (int i = 0; i < 4; ++i) steps.push_back(brief(h.step()));
    if (aging == 0.0) {
      EXPECT_EQ(steps, (std::vector<std::string>{"1:1+1* 2:1+1*", "1:2+1* 2:2+1*", "1:3+1* 2:3+1*",
                                                  "1:4+1* 2:4+1*"}));
    } else {
      EXPECT_EQ(steps, (std::vector<std::string>{"1:1+1* 2:1+1*", "3:1+1* 1:2+1*", "2:2+1* 3:2+1*",
                                                  "1:3+1* 2:3+1*"}));
    }
  }
}

// Pool of 4 blocks of 4 tokens. A and B (same priority, B later) prefill 7
// tokens each (2 blocks each); at step 2 A needs a third block: B, the latest
// arrival, is preempted by recompute and later resumes with its prefix hit.
TEST(Scheduler, PreemptByRecomputeThenResumeWithPrefixHit) {
  Harness h(4, 4, config(64));
  h.add(req(1, range(1, 7), 12));
  h.add(req(2, range(101, 7), 12));
  EXPECT_EQ(brief(h.step()), "1:0+7* 2:0+7*");
  EXPECT_EQ(h.table(1), (Ids{0, 1}));
  EXPECT_EQ(h.table(2), (Ids{2, 3}));
  EXPECT_EQ(brief(h.step()), "1:7+1* 2:7+1*");

  SchedulerOutput o = h.step();
  EXPECT_EQ(brief(o), "1:8+1*");
  EXPECT_EQ(o.preempted, (std::vector<SeqId>{2}));
  EXPECT_TRUE(o.swap_out.empty());
  EXPECT_EQ(h.table(1), (Ids{0, 1, 3}));  // B's deepest block (cached, now evictable) went first
  EXPECT_EQ(h.kv->stats().evictions, 1);
  EXPECT_EQ(h.s->n_preemptions(), 1);
  EXPECT_EQ(h.s->state(2), Scheduler::SeqState::waiting);
  EXPECT_EQ(h.s->num_computed(2), 0);
  EXPECT_EQ(h.s->tokens(2), (Toks{101, 102, 103, 104, 105, 106, 107, 1000, 1001}));  // generated kept

  EXPECT_EQ(brief(h.step()), "1:9+1*");  // B's hit block + 2 more would need 3 blocks; 1 is free
  h.s->finish(1);

  o = h.step();
  EXPECT_EQ(brief(o), "2:4+5*");  // the first block (still cached) is not recomputed
  EXPECT_EQ(o.seqs[0].tokens, (Toks{105, 106, 107, 1000, 1001}));
  EXPECT_EQ(o.seqs[0].block_table, (Ids{2, 3, 1}));
  EXPECT_EQ(h.kv->stats().prefix_hit_tokens, 4);
  EXPECT_EQ(brief(h.step()), "2:9+1*");
  EXPECT_EQ(h.s->n_preemptions(), 1);
}

TEST(Scheduler, PreemptBySwapThenSwapIn) {
  SchedulerConfig c = config(64);
  c.preemption = SchedulerConfig::Preemption::swap;
  Harness h(4, 4, c, /*n_host=*/4);
  h.add(req(1, range(1, 7), 12));
  h.add(req(2, range(101, 7), 12));
  EXPECT_EQ(brief(h.step()), "1:0+7* 2:0+7*");
  EXPECT_EQ(brief(h.step()), "1:7+1* 2:7+1*");

  SchedulerOutput o = h.step();
  EXPECT_EQ(brief(o), "1:8+1*");
  EXPECT_EQ(o.preempted, (std::vector<SeqId>{2}));
  EXPECT_EQ(o.swap_out, (Swaps{{2, 0}, {3, 1}}));
  EXPECT_TRUE(o.swap_in.empty());
  EXPECT_EQ(h.table(1), (Ids{0, 1, 3}));
  EXPECT_EQ(h.s->state(2), Scheduler::SeqState::swapped);
  EXPECT_EQ(h.s->num_computed(2), 8);  // kept: nothing to recompute
  EXPECT_EQ(h.s->n_swapped(), 1u);
  EXPECT_EQ(h.kv->n_free_host_blocks(), 2);

  EXPECT_EQ(brief(h.step()), "1:9+1*");  // swap-in needs 3 blocks, 1 is free
  h.s->finish(1);

  o = h.step();
  EXPECT_EQ(brief(o), "2:8+1*");
  EXPECT_EQ(o.swap_in, (Swaps{{3, 0}, {2, 1}}));
  EXPECT_EQ(o.seqs[0].block_table, (Ids{3, 2, 1}));
  EXPECT_EQ(o.seqs[0].tokens, (Toks{1001}));
  EXPECT_EQ(h.s->state(2), Scheduler::SeqState::running);
  EXPECT_EQ(h.kv->n_free_host_blocks(), 4);
  EXPECT_EQ(h.s->n_preemptions(), 1);
}

TEST(Scheduler, SwapFallsBackToRecomputeWithoutHostSpace) {
  SchedulerConfig c = config(64);
  c.preemption = SchedulerConfig::Preemption::swap;
  Harness h(4, 4, c, /*n_host=*/1);
  h.add(req(1, range(1, 7), 12));
  h.add(req(2, range(101, 7), 12));
  h.step();
  h.step();
  SchedulerOutput o = h.step();
  EXPECT_EQ(o.preempted, (std::vector<SeqId>{2}));
  EXPECT_TRUE(o.swap_out.empty());
  EXPECT_EQ(h.s->state(2), Scheduler::SeqState::waiting);
}

// Victims: highest priority value first, then the latest arrival; never a seq
// already scheduled in the step.
TEST(Scheduler, PreemptionVictimOrder) {
  Harness h(6, 2, config(64));
  h.add(req(1, range(1, 3), 10, 0));
  h.add(req(2, range(11, 3), 10, 1));
  h.add(req(3, range(21, 3), 10, 1));
  EXPECT_EQ(brief(h.step()), "1:0+3* 2:0+3* 3:0+3*");
  EXPECT_EQ(brief(h.step()), "1:3+1* 2:3+1* 3:3+1*");
  SchedulerOutput o = h.step();  // everyone needs a third block; none is free
  EXPECT_EQ(brief(o), "1:4+1* 2:4+1*");
  EXPECT_EQ(o.preempted, (std::vector<SeqId>{3}));
  EXPECT_EQ(brief(h.step()), "1:5+1* 2:5+1*");
  o = h.step();
  EXPECT_EQ(brief(o), "1:6+1*");
  EXPECT_EQ(o.preempted, (std::vector<SeqId>{2}));
  EXPECT_EQ(h.s->n_preemptions(), 2);
}

TEST(Scheduler, MoreImportantSeqPreemptsALessImportantOne) {
  Harness h(4, 2, config(64));
  h.add(req(1, range(1, 3), 8, 0));
  h.add(req(2, range(11, 3), 8, 1));
  h.step();
  h.step();
  // Both need a block at position 4. Seq 1 (more important) goes first and
  // preempts seq 2, which was not scheduled yet.
  SchedulerOutput o = h.step();
  EXPECT_EQ(brief(o), "1:4+1*");
  EXPECT_EQ(o.preempted, (std::vector<SeqId>{2}));
}

TEST(Scheduler, SeqPreemptsItselfWhenOnlyScheduledSeqsCouldMakeRoom) {
  Harness h(4, 2, config(64));
  h.add(req(1, range(1, 3), 8, 0));   // blocks 0, 1; position 3 still fits in block 1
  h.add(req(2, range(11, 4), 8, 0));  // blocks 2, 3; position 4 needs a new block
  EXPECT_EQ(brief(h.step()), "1:0+3* 2:0+4*");
  SchedulerOutput o = h.step();
  EXPECT_EQ(brief(o), "1:3+1*");  // seq 1 is already scheduled: seq 2 gives way itself
  EXPECT_EQ(o.preempted, (std::vector<SeqId>{2}));
  EXPECT_EQ(h.s->state(2), Scheduler::SeqState::waiting);
  EXPECT_EQ(h.table(1), (Ids{0, 1}));
}

TEST(Scheduler, ForkSharesBlocksAndCopiesOnWriteOnce) {
  Harness h(16, 4, config(64));
  h.add(req(1, range(1, 6), 20));
  EXPECT_EQ(brief(h.step()), "1:0+6*");
  h.s->fork(1, 2);
  h.s->set_last_token(2, 555);  // the second sample of the same logits
  EXPECT_EQ(h.s->tokens(2), (Toks{1, 2, 3, 4, 5, 6, 555}));
  EXPECT_EQ(h.s->num_computed(2), 6);
  EXPECT_EQ(h.table(2), (Ids{0, 1}));
  EXPECT_EQ(h.kv->ref_count(1), 2);
  SchedulerOutput o = h.step();
  EXPECT_EQ(brief(o), "1:6+1* 2:6+1*");
  EXPECT_EQ(o.copies, (std::vector<BlockCopy>{{1, 2}}));
  EXPECT_EQ(o.seqs[0].tokens, (Toks{1000}));
  EXPECT_EQ(o.seqs[1].tokens, (Toks{555}));
  EXPECT_EQ(o.seqs[0].block_table, (Ids{0, 2}));
  EXPECT_EQ(o.seqs[1].block_table, (Ids{0, 1}));
  EXPECT_EQ(h.kv->ref_count(0), 2);
  EXPECT_EQ(h.kv->ref_count(1), 1);
  o = h.step();
  EXPECT_TRUE(o.copies.empty());
  h.s->finish(1);
  h.s->finish(2);
  EXPECT_EQ(h.kv->n_free_blocks(), 16);
}

TEST(Scheduler, SecondRequestSkipsCachedPrefix) {
  Harness h(64, 16, config(256));
  Toks a = range(1, 40);
  h.add(req(1, a, 64));
  EXPECT_EQ(brief(h.step()), "1:0+40*");
  h.s->finish(1);
  Toks b(a.begin(), a.begin() + 32);
  for (int i = 0; i < 8; ++i) b.push_back(500 + i);
  h.add(req(2, b, 64));
  h.add(req(3, a, 64, 0, PrefixKey{7, 0}));  // another tenant: no hit
  EXPECT_EQ(brief(h.step()), "2:32+8* 3:0+40*");
  const auto st = h.kv->stats();
  EXPECT_EQ(st.prefix_queries, 3);
  EXPECT_EQ(st.prefix_hit_tokens, 32);
  EXPECT_EQ(h.s->num_cached_prompt_tokens(2), 32);
  EXPECT_EQ(h.s->num_cached_prompt_tokens(3), 0);
  h.s->fork(2, 4);
  EXPECT_EQ(h.s->num_cached_prompt_tokens(4), 32);
  EXPECT_EQ(h.s->num_cached_prompt_tokens(99), 0);
}

// A seq added with prefix_hits = false (prompt log-probs) computes its whole
// prompt even when the cache holds it, in chunks of at most max_chunk, also
// when recomputed after preemption; its blocks still serve later requests.
TEST(Scheduler, NoPrefixHitsAndMaxChunk) {
  Harness h(64, 16, config(256));
  Toks a = range(1, 40);
  h.add(req(1, a, 64));
  EXPECT_EQ(brief(h.step()), "1:0+40*");
  h.s->finish(1);
  SeqRequest r = req(2, a, 64);
  r.prefix_hits = false;
  r.max_chunk = 16;
  h.add(std::move(r));
  EXPECT_EQ(brief(h.step()), "2:0+16");
  EXPECT_EQ(brief(h.step()), "2:16+16");
  h.s->requeue(2);  // recompute from 0 again, not from a hit
  EXPECT_EQ(brief(h.step()), "2:0+16");
  EXPECT_EQ(brief(h.step()), "2:16+16");
  EXPECT_EQ(brief(h.step()), "2:32+8*");
  EXPECT_EQ(h.s->num_cached_prompt_tokens(2), 0);
  h.add(req(3, a, 64));  // a plain request still hits the cached blocks
  EXPECT_EQ(brief(h.step()), "2:40+1* 3:32+8*");
}

TEST(Scheduler, ChunkedPrefillOffWaitsForTheWholePrompt) {
  SchedulerConfig c = config(16);
  c.enable_chunked_prefill = false;
  Harness h(64, 4, c);
  h.add(req(1, range(1, 4), 12));
  EXPECT_EQ(brief(h.step()), "1:0+4*");
  h.add(req(2, range(100, 16), 17));
  EXPECT_EQ(brief(h.step()), "1:4+1*");  // 15 tokens left < 16
  h.s->finish(1);
  EXPECT_EQ(brief(h.step()), "2:0+16*");
}

TEST(Scheduler, LengthReachedIsNotScheduledAgain) {
  Harness h(16, 4, config(64));
  h.add(req(1, range(1, 4), 6));
  EXPECT_EQ(brief(h.step()), "1:0+4*");
  EXPECT_FALSE(h.s->length_reached(1));
  EXPECT_EQ(brief(h.step()), "1:4+1*");
  EXPECT_TRUE(h.s->length_reached(1));
  EXPECT_EQ(h.s->tokens(1).size(), 6u);
  EXPECT_EQ(brief(h.step()), "");
  h.s->finish(1);
  EXPECT_FALSE(h.s->has_unfinished());
}

TEST(Scheduler, CancelInEveryState) {
  SchedulerConfig c = config(64);
  c.preemption = SchedulerConfig::Preemption::swap;
  Harness h(4, 4, c, /*n_host=*/4);
  h.add(req(9, range(50, 4), 12));
  h.s->finish(9);  // waiting
  EXPECT_FALSE(h.s->contains(9));
  h.add(req(1, range(1, 7), 12));
  h.add(req(2, range(101, 7), 12));
  EXPECT_EQ(brief(h.step()), "1:0+7* 2:0+7*");
  h.step();
  h.step();  // seq 2 swapped out
  ASSERT_EQ(h.s->state(2), Scheduler::SeqState::swapped);
  EXPECT_EQ(h.kv->n_free_host_blocks(), 2);
  h.s->finish(2);  // swapped
  EXPECT_EQ(h.kv->n_free_host_blocks(), 4);
  EXPECT_EQ(h.s->n_swapped(), 0u);
  h.s->finish(1);  // running
  EXPECT_FALSE(h.s->has_unfinished());
  EXPECT_EQ(h.kv->n_free_blocks(), 4);
  EXPECT_EQ(brief(h.step()), "");
  h.s->finish(12345);  // unknown: no-op
}

TEST(Scheduler, CancelBetweenScheduleAndUpdate) {
  Harness h(16, 4, config(64));
  h.add(req(1, range(1, 4), 12));
  h.add(req(2, range(11, 4), 12));
  SchedulerOutput o = h.s->schedule();
  h.s->finish(1);
  std::vector<std::pair<SeqId, TokenId>> sampled = {{1, 7}, {2, 8}};
  h.s->update(o, sampled);
  EXPECT_EQ(h.s->tokens(2), (Toks{11, 12, 13, 14, 8}));
  EXPECT_EQ(brief(h.step()), "2:4+1*");
}

// A seeded random workload under memory pressure: every step's output obeys
// the invariants, two runs give identical outputs, and everything finishes.
TEST(Scheduler, RandomWorkloadIsDeterministicAndDrains) {
  auto run = [](SchedulerConfig::Preemption mode) {
    SchedulerConfig c = config(24, 6);
    c.preemption = mode;
    c.aging_per_step = 0.25;
    Harness h(12, 4, c, /*n_host=*/6);
    uint64_t rng = 12345;
    auto next = [&rng](uint64_t n) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      return (rng >> 33) % n;
    };
    std::ostringstream log;
    size_t n_swapped_out = 0;
    SeqId next_id = 1;
    int64_t steps = 0;
    for (; steps < 2000; ++steps) {
      if (next_id <= 40 && next(3) == 0) {
        const int n = 1 + static_cast<int>(next(20));
        const TokenId base = static_cast<TokenId>(next(4) * 8);  // shared prefixes happen
        EXPECT_TRUE(h.s->add(req(next_id, range(base, n), n + 1 + static_cast<int64_t>(next(16)),
                                 static_cast<int32_t>(next(3))))
                        .ok());
        ++next_id;
      }
      SchedulerOutput o = h.step();
      log << brief(o) << "|" << o.copies.size() << "," << o.swap_in.size() << "," << o.swap_out.size() << ","
          << o.preempted.size() << "\n";
      n_swapped_out += o.swap_out.size();
      for (const ScheduledSeq& ss : o.seqs)
        if (h.s->contains(ss.seq) && (h.s->length_reached(ss.seq) || next(40) == 0)) h.s->finish(ss.seq);
      if (next_id > 40 && !h.s->has_unfinished()) break;
    }
    EXPECT_LT(steps, 2000) << "did not drain";
    EXPECT_EQ(h.kv->n_free_blocks(), 12);
    EXPECT_EQ(h.kv->n_free_host_blocks(), 6);
    EXPECT_EQ(h.kv->stats().used_blocks, 0);
    if (mode == SchedulerConfig::Preemption::swap) {
      EXPECT_GT(n_swapped_out, 0u);
    }
    return std::make_pair(log.str(), h.s->n_preemptions());
  };
  for (auto mode : {SchedulerConfig::Preemption::recompute, SchedulerConfig::Preemption::swap}) {
    const auto a = run(mode);
    const auto b = run(mode);
    EXPECT_EQ(a.first, b.first);
    EXPECT_GT(a.second, 0) << "the workload should exercise preemption";
  }
}


// --- speculative decoding: draft slots, budget, rollback, adaptive length ---

// Speculating harness step: every decode with draft slots "drafts" n_draft
// tokens 2000.. and the target accepts `accept` of them (then samples 1000 + step).
SchedulerOutput spec_step(Harness& h, int32_t accept) {
  SchedulerOutput out = h.s->schedule();
  h.check(out);
  std::vector<SeqAdvance> adv;
  for (const ScheduledSeq& ss : out.seqs) {
    if (!ss.needs_logits) continue;
    SeqAdvance a{ss.seq, {}, ss.n_draft};
    for (int32_t j = 0; j < std::min(accept, ss.n_draft); ++j) a.tokens.push_back(2000 + j);
    a.tokens.push_back(static_cast<TokenId>(1000 + out.step));
    adv.push_back(a);
  }
  h.s->update(out, adv);
  return out;
}

TEST(SchedulerSpec, DraftSlotsCountInBudgetAndRollBack) {
  SchedulerConfig c = config(16);
  c.draft_max = 4;
  Harness h(32, 4, c);
  h.add(req(1, range(1, 6), 40));
  SeqRequest plain = req(2, range(100, 3), 40);
  plain.speculate = false;
  h.add(plain);
  // Prefill: no drafts.
  SchedulerOutput out = spec_step(h, 0);
  EXPECT_EQ(brief(out), "1:0+6* 2:0+3*");
  EXPECT_EQ(out.seqs[0].n_draft, 0);
  // Decode: seq 1 gets draft_max slots (its first draft), seq 2 none; the
  // budget counts them: 1 + 4 + 1.
  out = spec_step(h, 1);
  EXPECT_EQ(brief(out), "1:6+1* 2:3+1*");
  EXPECT_EQ(out.seqs[0].n_draft, 4);
  EXPECT_EQ(out.seqs[1].n_draft, 0);
  EXPECT_EQ(out.n_tokens, 6);
  // Positions 6..10 were written; 1 draft accepted -> 8 computed, 9 tokens.
  EXPECT_EQ(h.s->num_computed(1), 8);
  EXPECT_EQ(h.s->tokens(1).size(), 9u);
  EXPECT_EQ(h.s->tokens(1)[7], 2000);
  EXPECT_EQ(h.s->tokens(1)[8], 1001);
  // Rollback: blocks for 8 positions remain (the 11 written needed 3).
  EXPECT_EQ(h.table(1).size(), 2u);
  // Adaptive length: mean accepted 1 -> k = 2.
  EXPECT_EQ(h.s->draft_len(1), 2);
  EXPECT_EQ(h.s->draft_len(2), 0);
}

// 64 blocks of 4 tokens, budget 64; seq 1 with a 4-token prompt, prefilled.
std::unique_ptr<Harness> spec_harness(int32_t draft_max, int32_t draft_min, int64_t max_total) {
  SchedulerConfig c = config(64);
  c.draft_max = draft_max;
  c.draft_min = draft_min;
  auto h = std::make_unique<Harness>(64, 4, c);
  h->add(req(1, range(1, 4), max_total));
  spec_step(*h, 0);  // prefill
  return h;
}

TEST(SchedulerSpec, DraftLengthAdaptsAndRespectsLimits) {
  auto hp = spec_harness(6, 2, 60);
  Harness& h = *hp;
  // Nothing accepted: k falls to draft_min (never below).
  for (int i = 0; i < 8; ++i) spec_step(h, 0);
  EXPECT_EQ(h.s->draft_len(1), 2);
  // Everything accepted: k climbs back to draft_max.
  for (int i = 0; i < 12; ++i) spec_step(h, 100);
  EXPECT_EQ(h.s->draft_len(1), 6);
  // Never past max_total_tokens: the accepted drafts plus one sampled token fit.
  while (!h.s->length_reached(1)) {
    const SchedulerOutput out = spec_step(h, 100);
    ASSERT_EQ(out.seqs.size(), 1u);
    EXPECT_LE(static_cast<int64_t>(h.s->tokens(1).size()), 60);
  }
  EXPECT_EQ(h.s->tokens(1).size(), 60u);
  h.s->finish(1);
  EXPECT_EQ(h.kv->n_free_blocks(), 64);
}

TEST(SchedulerSpec, UselessDraftsPauseAndProbe) {
  auto hp = spec_harness(4, 0, 200);
  Harness& h = *hp;
  SchedulerOutput out = spec_step(h, 0);
  EXPECT_EQ(out.seqs[0].n_draft, 4);
  // Nothing accepted: the running mean drops below the pause threshold, then
  // one probe draft per kProbeEvery decodes.
  std::vector<int32_t> ks;
  for (int i = 0; i < 3 * (Scheduler::kProbeEvery + 1); ++i) ks.push_back(spec_step(h, 0).seqs[0].n_draft);
  std::vector<int32_t> want;
  for (int r = 0; r < 3; ++r) {
    want.insert(want.end(), Scheduler::kProbeEvery, 0);
    want.push_back(1);  // a probe: ceil(mean 0) + 1
  }
  EXPECT_EQ(ks, want);
  // Probes that succeed bring speculation back.
  for (int i = 0; i < 3 * (Scheduler::kProbeEvery + 1); ++i) spec_step(h, 100);
  EXPECT_GE(h.s->draft_len(1), 2);
}

TEST(SchedulerSpec, BudgetAndMemoryLimitDrafts) {
  SchedulerConfig c = config(3);
  c.draft_max = 8;
  Harness h(3, 4, c);
  h.add(req(1, range(1, 3), 12));
  spec_step(h, 0);
  // Budget 3: one decode token and at most 2 drafts.
  SchedulerOutput out = spec_step(h, 0);
  EXPECT_EQ(out.seqs[0].n_draft, 2);
  // Pool of 3 blocks (12 positions); drafts that do not fit are dropped
  // rather than preempting: fill up and watch n_draft shrink to what fits.
  while (!h.s->length_reached(1)) {
    out = spec_step(h, 100);
    EXPECT_TRUE(out.preempted.empty());
  }
  EXPECT_EQ(h.s->n_preemptions(), 0);
}

TEST(SchedulerSpec, ValidateDraftLimits) {
  SchedulerConfig c;
  c.draft_max = -1;
  EXPECT_FALSE(Scheduler::validate(c).ok());
  c.draft_max = Scheduler::kMaxDraft + 1;
  EXPECT_FALSE(Scheduler::validate(c).ok());
  c.draft_max = 4;
  c.draft_min = 5;
  EXPECT_FALSE(Scheduler::validate(c).ok());
  c.draft_min = 4;
  EXPECT_TRUE(Scheduler::validate(c).ok());
}

SchedulerConfig background_config(int32_t budget, int32_t bg_cap) {
  SchedulerConfig c = config(budget);
  c.background_priority = 1000;
  c.background_prefill_tokens = bg_cap;
  return c;
}

TEST(SchedulerBackground, CappedPerStepAndYieldingToForegroundPrefill) {
  Harness h(64, 16, background_config(64, 20));
  h.add(req(1, range(1, 30), 200, 1000));  // background
  h.add(req(2, range(100, 30), 200, 1000));  // background
  // Alone, the background shares its own cap of 20 prompt tokens a step (decodes are not capped).
  EXPECT_EQ(brief(h.step()), "1:0+20");
  EXPECT_EQ(brief(h.step()), "1:20+10* 2:0+10");
  EXPECT_EQ(brief(h.step()), "1:30+1* 2:10+20*");
  // A foreground request arrives: its prefill runs in a step of its own.
  h.add(req(3, range(200, 40), 200, 0));
  EXPECT_EQ(brief(h.step()), "3:0+40*");
  // Then its decodes share steps with the background again (decodes first, foreground first).
  EXPECT_EQ(brief(h.step()), "3:40+1* 1:31+1* 2:30+1*");
  EXPECT_EQ(brief(h.step()), "3:41+1* 1:32+1* 2:31+1*");
  // A foreground prompt longer than the budget keeps the background out until its last chunk.
  h.add(req(4, range(300, 100), 200, 5));
  EXPECT_EQ(brief(h.step()), "3:42+1* 4:0+63");
  EXPECT_EQ(brief(h.step()), "3:43+1* 4:63+37*");
  EXPECT_EQ(brief(h.step()), "3:44+1* 4:100+1* 1:33+1* 2:32+1*");
}

TEST(SchedulerBackground, AForegroundSeqThatCannotBeAdmittedDoesNotStallTheBackground) {
  // 6 blocks of 16: the background seq holds 4; the foreground prompt needs 3.
  Harness h(6, 16, background_config(64, 0));
  h.add(req(1, range(1, 60), 70, 1000));
  EXPECT_EQ(brief(h.step()), "1:0+60*");
  h.add(req(2, range(100, 40), 45, 0));
  // Step 1 for the foreground fails to admit (3 blocks needed, 2 free): the background decodes on.
  for (int i = 0; i < 9; ++i) EXPECT_EQ(brief(h.step()), "1:" + std::to_string(60 + i) + "+1*") << i;
  EXPECT_TRUE(h.s->length_reached(1));
  h.s->finish(1);
  EXPECT_EQ(brief(h.step()), "2:0+40*");
}

TEST(SchedulerBackground, OffByDefaultIsOnePass) {
  // Without background_priority, priority 1000 is only less important: no cap, no yielding.
  Harness h(64, 16, config(64));
  h.add(req(1, range(1, 30), 200, 1000));
  EXPECT_EQ(brief(h.step()), "1:0+30*");
  h.add(req(3, range(200, 40), 200, 0));
  EXPECT_EQ(brief(h.step()), "1:30+1* 3:0+40*");
  SchedulerConfig bad = config(64);
  bad.background_prefill_tokens = -1;
  EXPECT_EQ(Scheduler::validate(bad).code(), StatusCode::invalid_argument);
}

}  // namespace
}  // namespace serval
