// End-to-end check of the allocator and scheduler without a model: a fake
// runner keeps, for every device and host block slot, the token id whose K/V
// would be stored there, applies each step's swap/copy lists, and writes the
// scheduled tokens. Before every step, each scheduled seq must find exactly
// its own tokens at positions [0, start_pos) through its block table: prefix
// hits, copy-on-write, eviction, swapping and forks never hand a sequence
// another sequence's KV.
#include <gtest/gtest.h>

#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "kv_cache/kv_cache_manager.h"
#include "scheduler/scheduler.h"

namespace serval {
namespace {

struct Lcg {
  uint64_t s;
  uint64_t next(uint64_t n) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return (s >> 33) % n;
  }
};

struct Scenario {
  uint64_t seed;
  int32_t n_blocks, block_size, n_host, budget, max_seqs;
  SchedulerConfig::Preemption mode;
  bool copies_before_swap_in;  // the two runner orders that are safe
  bool collide = false;        // every block hashes alike: only exact verification helps
};

void PrintTo(const Scenario& s, std::ostream* os) {
  *os << "seed " << s.seed << ", " << s.n_blocks << " blocks of " << s.block_size << ", " << s.n_host
      << " host blocks, budget " << s.budget << ", max_seqs " << s.max_seqs;
}

class SimulatedKv : public ::testing::TestWithParam<Scenario> {};

TEST_P(SimulatedKv, EverySeqReadsExactlyItsOwnTokens) {
  const Scenario sc = GetParam();
  KvCacheConfig kc;
  kc.n_blocks = sc.n_blocks;
  kc.block_size = sc.block_size;
  kc.n_host_blocks = sc.n_host;
  if (sc.collide) kc.hash_fn = [](const Hash128&, std::span<const TokenId>, const PrefixKey&) { return Hash128{1, 2}; };
  KvCacheManager kv(kc);
  SchedulerConfig c;
  c.max_batch_tokens = sc.budget;
  c.max_seqs = sc.max_seqs;
  c.max_model_len = 4096;
  c.preemption = sc.mode;
  c.aging_per_step = 0.1;
  Scheduler s(c, &kv);

  const size_t bs = static_cast<size_t>(sc.block_size);
  std::vector<TokenId> device(static_cast<size_t>(sc.n_blocks) * bs, -1);
  std::vector<TokenId> host(static_cast<size_t>(sc.n_host) * bs, -1);
  auto slot = [&](const std::vector<BlockId>& table, int64_t pos) -> TokenId& {
    return device[static_cast<size_t>(table[static_cast<size_t>(pos) / bs]) * bs + static_cast<size_t>(pos) % bs];
  };
  auto move = [&](std::vector<TokenId>& dst, int32_t d, const std::vector<TokenId>& src, int32_t from) {
    std::copy_n(src.begin() + static_cast<ptrdiff_t>(from) * static_cast<ptrdiff_t>(bs), bs,
                dst.begin() + static_cast<ptrdiff_t>(d) * static_cast<ptrdiff_t>(bs));
  };

  Lcg rng{sc.seed};
  const int max_positions = sc.n_blocks * sc.block_size;
  SeqId next_id = 1;
  int n_added = 0, n_forks = 0;
  int64_t checked_positions = 0;
  size_t n_copies = 0, n_swapped_out = 0;
  for (int step = 0; step < 3000; ++step) {
    if (n_added < 60 && rng.next(2) == 0) {
      // Prompts share prefixes (4 families) and tenants (2 salts).
      const int n = 1 + static_cast<int>(rng.next(static_cast<uint64_t>(std::min(40, max_positions / 2))));
      const auto family = static_cast<TokenId>(rng.next(4));
      std::vector<TokenId> prompt(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) prompt[static_cast<size_t>(i)] = family * 1000 + (i < n / 2 + 3 ? i : 500 + i);
      SeqRequest r;
      r.seq = next_id++;
      r.prompt = prompt;
      r.max_total_tokens = std::min<int64_t>(n + 1 + static_cast<int64_t>(rng.next(24)), max_positions + 1);
      r.priority = static_cast<int32_t>(rng.next(3));
      r.prefix_key = PrefixKey{rng.next(2), 0};
      ASSERT_TRUE(s.add(r).ok());
      ++n_added;
    }
    SchedulerOutput out = s.schedule();
    n_copies += out.copies.size();
    n_swapped_out += out.swap_out.size();

    // The runner: block moves, then check and write each seq's tokens.
    for (const BlockSwap& m : out.swap_out) move(host, m.host, device, m.device);
    if (sc.copies_before_swap_in) {
      for (const BlockCopy& m : out.copies) move(device, m.dst, device, m.src);
      for (const BlockSwap& m : out.swap_in) move(device, m.device, host, m.host);
    } else {
      for (const BlockSwap& m : out.swap_in) move(device, m.device, host, m.host);
      for (const BlockCopy& m : out.copies) move(device, m.dst, device, m.src);
    }
    for (const ScheduledSeq& ss : out.seqs) {
      const auto& toks = s.tokens(ss.seq);
      for (int64_t p = 0; p < ss.start_pos; ++p) {
        ASSERT_EQ(slot(ss.block_table, p), toks[static_cast<size_t>(p)])
            << "step " << step << " seq " << ss.seq << " position " << p;
        ++checked_positions;
      }
    }
    for (const ScheduledSeq& ss : out.seqs)
      for (int32_t i = 0; i < ss.n_tokens; ++i) slot(ss.block_table, ss.start_pos + i) = ss.tokens[static_cast<size_t>(i)];
    for (const ScheduledSeq& ss : out.seqs) {  // nobody overwrote anybody in this step
      const auto& toks = s.tokens(ss.seq);
      for (int64_t p = 0; p < ss.start_pos + ss.n_tokens; ++p)
        ASSERT_EQ(slot(ss.block_table, p), toks[static_cast<size_t>(p)]) << "step " << step << " after writes";
    }

    std::vector<std::pair<SeqId, TokenId>> sampled;
    for (const ScheduledSeq& ss : out.seqs)
      if (ss.needs_logits) sampled.push_back({ss.seq, static_cast<TokenId>(10000 + rng.next(8))});
    s.update(out, sampled);

    // n > 1: fork some freshly sampled seqs; finish by length or at random.
    for (const auto& [id, t] : sampled) {
      if (n_forks < 30 && !s.length_reached(id) && rng.next(6) == 0) {
        const SeqId child = next_id++;
        s.fork(id, child, static_cast<TokenId>(20000 + rng.next(8)));
        ++n_forks;
      }
    }
    for (const auto& [id, t] : sampled)
      if (s.contains(id) && (s.length_reached(id) || rng.next(30) == 0)) s.finish(id);
    if (n_added >= 60 && !s.has_unfinished()) break;
  }
  EXPECT_FALSE(s.has_unfinished()) << "did not drain";
  EXPECT_EQ(kv.n_free_blocks(), sc.n_blocks);
  EXPECT_EQ(kv.n_free_host_blocks(), sc.n_host);
  EXPECT_GT(checked_positions, 1000);
  EXPECT_GT(kv.stats().prefix_hit_tokens, 0);
  // The scenarios are sized to exercise forks with copy-on-write, swapping
  // and preemption (seeded, so these counts are fixed).
  if (sc.block_size > 1) {
    EXPECT_GT(n_copies, 0u);
  }
  if (sc.mode == SchedulerConfig::Preemption::swap) {
    EXPECT_GT(n_swapped_out, 0u);
  }
  if (sc.n_blocks < 64) {
    EXPECT_GT(s.n_preemptions(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, SimulatedKv,
    ::testing::Values(Scenario{1, 16, 4, 0, 32, 8, SchedulerConfig::Preemption::recompute, true},
                      Scenario{2, 12, 4, 8, 24, 6, SchedulerConfig::Preemption::swap, true},
                      Scenario{3, 12, 4, 8, 24, 6, SchedulerConfig::Preemption::swap, false, true},
                      Scenario{4, 40, 1, 16, 16, 4, SchedulerConfig::Preemption::swap, false},
                      Scenario{5, 10, 8, 4, 64, 16, SchedulerConfig::Preemption::swap, true},
                      Scenario{6, 24, 2, 0, 7, 3, SchedulerConfig::Preemption::recompute, false, true},
                      Scenario{7, 64, 16, 0, 48, 8, SchedulerConfig::Preemption::recompute, true}),
    [](const ::testing::TestParamInfo<Scenario>& info) {
      const Scenario& s = info.param;
      return "seed" + std::to_string(s.seed) + "_bs" + std::to_string(s.block_size) +
             (s.mode == SchedulerConfig::Preemption::swap ? "_swap" : "_recompute") +
             (s.copies_before_swap_in ? "_copies_first" : "_swap_in_first") + (s.collide ? "_collide" : "");
    });

}  // namespace
}  // namespace serval
