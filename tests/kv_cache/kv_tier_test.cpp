// The prefix cache's lower tiers: the RAM tier's exact names and LRU, the disk
// tier's files (restart index, truncated / garbled / foreign / unfinished
// files, budget, persistent hash key), and KvCacheManager + TieredKvStore:
// blocks the pool evicts come back byte for byte, from RAM and from disk.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "kv_cache/disk_tier.h"
#include "kv_cache/kv_cache_manager.h"
#include "kv_cache/ram_tier.h"
#include "kv_cache/tiered_store.h"

namespace serval {
namespace {

namespace fs = std::filesystem;
using Toks = std::vector<TokenId>;

Toks range(TokenId from, int n) {
  Toks v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 g(seed);
  for (auto& b : v) b = (uint8_t)g();
  return v;
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("serval-kvtier-" + std::to_string(::getpid()) + "-" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::vector<fs::path> files(const std::string& ext) const {
    std::vector<fs::path> out;
    for (const auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ext) out.push_back(e.path());
    return out;
  }
};

TEST(RamTier, FindsOnlyTheExactBlockAndEvictsLeastRecentlyUsed) {
  RamTier t(2, 8);
  const Toks a = range(1, 4), b = range(5, 4), c = range(9, 4);
  const TierBlockMeta ma{{1, 1}, {}, {}, a}, mb{{2, 2}, {1, 1}, {}, b}, mc{{3, 3}, {2, 2}, {}, c};
  EXPECT_EQ(t.find(ma), -1);
  const int32_t sa = t.insert(ma);
  const int32_t sb = t.insert(mb);
  EXPECT_TRUE(t.full());
  EXPECT_EQ(t.find(ma), sa);
  EXPECT_EQ(t.find(mb), sb);
  // Same hash, anything else different: not this block.
  EXPECT_EQ(t.find({{2, 2}, {9, 9}, {}, b}), -1);           // parent
  EXPECT_EQ(t.find({{2, 2}, {1, 1}, {7, 0}, b}), -1);       // key (tenant salt)
  EXPECT_EQ(t.find({{2, 2}, {1, 1}, {}, range(6, 4)}), -1);  // tokens
  EXPECT_EQ(t.lru(), sa);
  t.touch(sa);
  EXPECT_EQ(t.lru(), sb);
  t.erase(t.lru());
  EXPECT_EQ(t.find(mb), -1);
  const int32_t sc = t.insert(mc);
  EXPECT_EQ(t.find(mc), sc);
  EXPECT_EQ((std::vector<int32_t>{sa, sc}), t.slots_lru());
}

DiskTierConfig disk_cfg(const fs::path& dir, size_t budget, Hash128 id = {42, 43}) {
  DiskTierConfig c;
  c.dir = dir.string();
  c.budget_bytes = budget;
  c.identity = id;
  c.block_size = 4;
  c.payload_bytes = 1000;
  return c;
}

TEST(DiskTier, SurvivesReopenWithTheSameKeyAndBytes) {
  TempDir d;
  const Toks a = range(1, 4);
  const TierBlockMeta m{{11, 12}, {}, {5, 0}, a};
  const auto bytes = pattern(1000, 1);
  uint64_t k0 = 0, k1 = 0;
  {
    auto t = DiskTier::open(disk_cfg(d.path, 1 << 20));
    ASSERT_TRUE(t.ok()) << t.status().message();
    k0 = (*t)->hash_k0();
    k1 = (*t)->hash_k1();
    (*t)->store(m, bytes.data());
    std::vector<uint8_t> out(1000);
    ASSERT_TRUE((*t)->load(m, out.data()));  // while (or after) it is written
    EXPECT_EQ(out, bytes);
    (*t)->drain();
    EXPECT_EQ((*t)->stats().writes, 1);
  }
  ASSERT_EQ(d.files(".kvb").size(), 1u);
  auto t = DiskTier::open(disk_cfg(d.path, 1 << 20));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->hash_k0(), k0);
  EXPECT_EQ((*t)->hash_k1(), k1);
  EXPECT_EQ((*t)->stats().recovered, 1);
  EXPECT_TRUE((*t)->contains(m));
  EXPECT_FALSE((*t)->contains({{11, 12}, {}, {6, 0}, a}));  // another tenant's key
  std::vector<uint8_t> out(1000);
  ASSERT_TRUE((*t)->load(m, out.data()));
  EXPECT_EQ(out, bytes);
}

TEST(DiskTier, DamagedUnfinishedAndForeignFilesAreNeverUsed) {
  TempDir d;
  const auto bytes = pattern(1000, 2);
  std::vector<TierBlockMeta> ms;
  std::vector<Toks> toks;
  for (int i = 0; i < 4; ++i) toks.push_back(range(10 * i, 4));
  for (int i = 0; i < 4; ++i) ms.push_back({{(uint64_t)i + 1, 7}, {}, {}, toks[(size_t)i]});
  {
    auto t = DiskTier::open(disk_cfg(d.path, 1 << 20));
    ASSERT_TRUE(t.ok());
    for (const auto& m : ms) (*t)->store(m, bytes.data());
    (*t)->drain();
  }
  auto files = d.files(".kvb");
  ASSERT_EQ(files.size(), 4u);
  std::sort(files.begin(), files.end());
  const size_t full = fs::file_size(files[0]);
  fs::resize_file(files[0], full / 2);  // truncated (a write cut short)
  {  // a garbled header byte
    std::fstream f(files[1], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x5a');
  }
  {  // a garbled payload byte: the header is fine, the load's checksum is not
    std::fstream f(files[2], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp((std::streamoff)full - 10);
    const char c = (char)(bytes[990] ^ 0xff);
    f.put(c);
  }
  std::ofstream(d.path / "00000000000000000000000000000001.tmp") << "half a write";  // killed mid-write
  {
    auto t = DiskTier::open(disk_cfg(d.path, 1 << 20));
    ASSERT_TRUE(t.ok());
    const auto st = (*t)->stats();
    EXPECT_EQ(st.recovered, 2);  // the payload damage is only found on load
    EXPECT_EQ(st.corrupt, 2);
    EXPECT_TRUE(d.files(".tmp").empty());
    int usable = 0;
    std::vector<uint8_t> out(1000);
    for (const auto& m : ms) {
      if (!(*t)->contains(m)) continue;
      if ((*t)->load(m, out.data())) {
        EXPECT_EQ(out, bytes);
        ++usable;
      }
    }
    EXPECT_EQ(usable, 1);
    EXPECT_EQ((*t)->stats().corrupt, 3);
    EXPECT_EQ(d.files(".kvb").size(), 1u);  // damaged files of ours are deleted
  }
  // Another identity (model, KV type or block layout): foreign, left alone, no hits.
  auto t = DiskTier::open(disk_cfg(d.path, 1 << 20, {1, 2}));
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->stats().foreign, 1);
  EXPECT_EQ((*t)->stats().files, 0);
  for (const auto& m : ms) EXPECT_FALSE((*t)->contains(m));
  EXPECT_EQ(d.files(".kvb").size(), 1u);
}

TEST(DiskTier, NeverExceedsItsBudget) {
  TempDir d;
  auto t0 = DiskTier::open(disk_cfg(d.path, 1));
  ASSERT_TRUE(t0.ok());
  const size_t fb = (*t0)->file_bytes();
  t0->reset();
  auto t = DiskTier::open(disk_cfg(d.path, 3 * fb + fb / 2));  // room for 3 files
  ASSERT_TRUE(t.ok());
  const auto bytes = pattern(1000, 3);
  std::vector<Toks> toks;
  for (int i = 0; i < 10; ++i) toks.push_back(range(i, 4));
  for (int i = 0; i < 10; ++i) {
    (*t)->store({{(uint64_t)i + 1, 1}, {}, {}, toks[(size_t)i]}, bytes.data(), /*blocking=*/true);
    EXPECT_LE((*t)->stats().bytes, (int64_t)(3 * fb + fb / 2));
    (*t)->drain();
    size_t on_disk = 0;
    for (const auto& f : d.files(".kvb")) on_disk += fs::file_size(f);
    EXPECT_LE(on_disk, 3 * fb + fb / 2);
  }
  EXPECT_EQ((*t)->stats().files, 3);
  EXPECT_EQ((*t)->stats().evictions, 7);
  // The 3 most recent are the ones kept.
  for (int i = 0; i < 10; ++i) EXPECT_EQ((*t)->contains({{(uint64_t)i + 1, 1}, {}, {}, toks[(size_t)i]}), i >= 7) << i;
}

TEST(DiskTier, PinnedFilesAreNeverEvicted) {
  TempDir d;
  auto t0 = DiskTier::open(disk_cfg(d.path, 1));
  ASSERT_TRUE(t0.ok());
  const size_t fb = (*t0)->file_bytes();
  t0->reset();
  auto t = DiskTier::open(disk_cfg(d.path, 3 * fb));
  ASSERT_TRUE(t.ok());
  const auto bytes = pattern(1000, 4);
  std::vector<Toks> toks;
  for (int i = 0; i < 10; ++i) toks.push_back(range(i, 4));
  auto meta = [&](int i) { return TierBlockMeta{{(uint64_t)i + 1, 1}, {}, {}, toks[(size_t)i]}; };
  EXPECT_TRUE((*t)->store(meta(0), bytes.data(), true, /*pinned=*/true));
  EXPECT_TRUE((*t)->store(meta(1), bytes.data(), true));
  EXPECT_TRUE((*t)->pin(meta(1)));
  EXPECT_TRUE((*t)->pin(meta(1)));  // pins nest
  EXPECT_FALSE((*t)->pin(meta(5)));  // not held
  for (int i = 2; i < 10; ++i) EXPECT_TRUE((*t)->store(meta(i), bytes.data(), true));
  EXPECT_TRUE((*t)->contains(meta(0)));
  EXPECT_TRUE((*t)->contains(meta(1)));
  EXPECT_TRUE((*t)->contains(meta(9)));
  EXPECT_EQ((*t)->stats().pinned, 2);
  // Full of pins: a pinned store that needs room fails, a plain one too.
  EXPECT_TRUE((*t)->pin(meta(9)));
  EXPECT_FALSE((*t)->store(meta(8), bytes.data(), true, true));
  EXPECT_FALSE((*t)->store(meta(7), bytes.data(), true));
  (*t)->unpin(meta(1));
  EXPECT_FALSE((*t)->store(meta(7), bytes.data(), true));  // block 1 still holds one pin
  (*t)->unpin(meta(1));
  EXPECT_TRUE((*t)->store(meta(7), bytes.data(), true));  // now block 1 goes
  EXPECT_FALSE((*t)->contains(meta(1)));
  EXPECT_TRUE((*t)->contains(meta(0)));
  EXPECT_LE((*t)->stats().bytes, (int64_t)(3 * fb));
}

// Polls ready(m) until true (the tier's reader thread works in the background).
bool wait_ready(DiskTier& t, const TierBlockMeta& m) {
  for (int i = 0; i < 10000; ++i) {
    if (t.ready(m)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// Promotion off the engine thread: prefetch() has the reader thread read and
// check the file into memory; load() then copies from there.
TEST(DiskTier, PrefetchStagesCheckedBlocksForLoad) {
  TempDir d;
  auto t = DiskTier::open(disk_cfg(d.path, 1 << 20));
  ASSERT_TRUE(t.ok());
  std::vector<Toks> toks;
  for (int i = 0; i < 3; ++i) toks.push_back(range(10 * i, 4));
  auto meta = [&](int i) { return TierBlockMeta{{(uint64_t)i + 1, 7}, {}, {}, toks[(size_t)i]}; };
  for (int i = 0; i < 3; ++i) (*t)->store(meta(i), pattern(1000, (uint32_t)i).data(), true);
  // (No ready() before the drain: whether the writer has finished by then is a
  // race, and ready() on a written block queues a read of it.)
  (*t)->drain();

  (*t)->prefetch(meta(0));
  ASSERT_TRUE(wait_ready(**t, meta(0)));
  EXPECT_EQ((*t)->stats().prefetches, 1);
  EXPECT_EQ((*t)->stats().staged_reads, 1);
  EXPECT_EQ((*t)->stats().staged_bytes, 1000);
  std::vector<uint8_t> out(1000);
  ASSERT_TRUE((*t)->load(meta(0), out.data()));
  EXPECT_EQ(out, pattern(1000, 0));
  EXPECT_EQ((*t)->stats().staged_loads, 1);
  EXPECT_EQ((*t)->stats().staged_bytes, 0);  // a staged copy is used once

  // Not prefetched: ready() queues its read and says no until it is done.
  EXPECT_FALSE((*t)->ready(meta(1)));
  EXPECT_EQ((*t)->stats().prefetches, 2);
  ASSERT_TRUE(wait_ready(**t, meta(1)));
  ASSERT_TRUE((*t)->load(meta(1), out.data()));
  EXPECT_EQ(out, pattern(1000, 1));
  const Toks other = range(500, 4);
  EXPECT_TRUE((*t)->ready({{99, 7}, {}, {}, other}));  // not held: a miss, nothing to wait for

  // A file damaged after it was written: the reader finds it out, and it is
  // never used (deleted and counted), as a synchronous load would.
  for (const auto& f : d.files(".kvb")) {
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(-1, std::ios::end);
    io.put('\x42');
  }
  (*t)->prefetch(meta(2));
  ASSERT_TRUE(wait_ready(**t, meta(2)));
  EXPECT_FALSE((*t)->contains(meta(2)));
  EXPECT_EQ((*t)->stats().corrupt, 1);
  EXPECT_EQ((*t)->stats().staged_bytes, 0);
  EXPECT_FALSE((*t)->load(meta(2), out.data()));
}

// Staged copies are bounded: the oldest go for newer reads, and a block whose
// copy went is read synchronously when it is loaded after all.
TEST(DiskTier, StagedBytesStayInTheirBound) {
  TempDir d;
  DiskTierConfig c = disk_cfg(d.path, 1 << 20);
  c.max_staged_bytes = 2500;  // two payloads
  auto t = DiskTier::open(c);
  ASSERT_TRUE(t.ok());
  std::vector<Toks> toks;
  for (int i = 0; i < 6; ++i) toks.push_back(range(10 * i, 4));
  auto meta = [&](int i) { return TierBlockMeta{{(uint64_t)i + 1, 8}, {}, {}, toks[(size_t)i]}; };
  for (int i = 0; i < 6; ++i) (*t)->store(meta(i), pattern(1000, (uint32_t)i + 50).data(), true);
  (*t)->drain();
  for (int i = 0; i < 6; ++i) {
    (*t)->prefetch(meta(i));
    EXPECT_LE((*t)->stats().staged_bytes, 2500);
    ASSERT_TRUE(wait_ready(**t, meta(i)));
  }
  EXPECT_EQ((*t)->stats().staged_reads, 6);
  EXPECT_EQ((*t)->stats().staged_drops, 4);
  EXPECT_EQ((*t)->stats().staged_bytes, 2000);
  std::vector<uint8_t> out(1000);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE((*t)->load(meta(i), out.data())) << i;
    EXPECT_EQ(out, pattern(1000, (uint32_t)i + 50)) << i;
  }
  EXPECT_EQ((*t)->stats().staged_loads, 2);  // the two most recent; the rest were read on load
  EXPECT_EQ((*t)->stats().staged_bytes, 0);

  // Evicted from the disk while staged: the memory is given back.
  t->reset();
  TempDir d2;
  c = disk_cfg(d2.path, 1);
  auto t0 = DiskTier::open(c);
  ASSERT_TRUE(t0.ok());
  c.budget_bytes = 2 * (*t0)->file_bytes();
  t0->reset();
  t = DiskTier::open(c);
  ASSERT_TRUE(t.ok());
  for (int i = 0; i < 2; ++i) (*t)->store(meta(i), pattern(1000, (uint32_t)i).data(), true);
  (*t)->drain();
  (*t)->prefetch(meta(0));
  ASSERT_TRUE(wait_ready(**t, meta(0)));
  EXPECT_EQ((*t)->stats().staged_bytes, 1000);
  (*t)->store(meta(2), pattern(1000, 2).data(), true);  // the least recently used goes: block 0
  EXPECT_FALSE((*t)->contains(meta(0)));
  EXPECT_EQ((*t)->stats().staged_bytes, 0);
  EXPECT_EQ((*t)->stats().staged_drops, 1);
}

// The manager with a real KvStorage and TieredKvStore: fill each block with a
// pattern named by its tokens, evict it by filling the pool with other
// sequences, then a new sequence with the same prompt gets the bytes back.
struct Rig {
  KvStorage storage;
  std::unique_ptr<TieredKvStore> tiers;
  std::unique_ptr<KvCacheManager> kv;
  static constexpr int32_t kBs = 4;

  explicit Rig(KvTierConfig tc, int32_t n_blocks = 6)
      : storage(std::move(KvStorage::create(KvGeometry{2, 8, kBs, KvType::f32}, n_blocks).value())) {
    auto t = TieredKvStore::create(tc, {&storage});
    EXPECT_TRUE(t.ok()) << t.status().message();
    tiers = std::move(t.value());
    KvCacheConfig c;
    c.n_blocks = n_blocks;
    c.block_size = kBs;
    if (DiskTier* d = tiers->disk()) {
      c.hash_k0 = d->hash_k0();
      c.hash_k1 = d->hash_k1();
    }
    kv = std::make_unique<KvCacheManager>(c);
    kv->set_tier(tiers.get());
  }
  // Block i of a prompt holds bytes derived from its first token.
  void write(BlockId b, TokenId first) {
    for (int32_t l = 0; l < 2; ++l) {
      auto k = pattern(kBs * 8 * 4, (uint32_t)first * 10 + (uint32_t)l);
      auto v = pattern(kBs * 8 * 4, (uint32_t)first * 10 + (uint32_t)l + 5);
      std::memcpy(storage.k(l, b), k.data(), k.size());
      std::memcpy(storage.v(l, b), v.data(), v.size());
    }
  }
  bool holds(BlockId b, TokenId first) const {
    for (int32_t l = 0; l < 2; ++l) {
      auto k = pattern(kBs * 8 * 4, (uint32_t)first * 10 + (uint32_t)l);
      auto v = pattern(kBs * 8 * 4, (uint32_t)first * 10 + (uint32_t)l + 5);
      if (std::memcmp(storage.k(l, b), k.data(), k.size()) || std::memcmp(storage.v(l, b), v.data(), v.size()))
        return false;
    }
    return true;
  }
  // Runs a then b in a disk-only rig whose pool holds one of them: a's blocks
  // are on disk (written) afterwards.
  void a_to_disk(const Toks& a, const Toks& b) {
    run(1, a);
    run(2, b);
    tiers->disk()->drain();
  }
  // Runs a prompt to completion ("computing" the blocks it did not hit) and frees it.
  int64_t run(SeqId s, const Toks& t) {
    const int64_t hit = kv->acquire_cached_prefix(s, t, {});
    std::vector<BlockCopy> copies;
    EXPECT_TRUE(kv->allocate(s, (int64_t)t.size(), hit, &copies));
    const auto table = kv->block_table(s);
    for (size_t i = 0; i < table.size(); ++i) {
      if ((int64_t)i * kBs < hit) {
        EXPECT_TRUE(holds(table[i], t[i * kBs])) << "block " << i << " came back with other bytes";
      } else {
        write(table[i], t[i * kBs]);
      }
    }
    kv->cache_full_blocks(s, t, (int64_t)t.size(), {});
    kv->free(s);
    return hit;
  }
};

TEST(TieredKvStore, EvictedPrefixComesBackFromRamThenFromDisk) {
  TempDir d;
  Rig probe(KvTierConfig{64 * 1024, "", 0, {1, 1}});
  const size_t pb = probe.tiers->payload_bytes();  // 2 layers * K,V * 4 tokens * 8 * 4 bytes = 512
  EXPECT_EQ(pb, 512u);
  // RAM for 4 blocks, disk for plenty; a pool of 6.
  Rig r(KvTierConfig{4 * pb, d.path.string(), 1 << 20, {1, 1}});
  const Toks a = range(100, 21), b = range(200, 21), c = range(300, 21);  // 5 full blocks each (+1 token)
  EXPECT_EQ(r.run(1, a), 0);
  EXPECT_EQ(r.run(2, b), 0);  // evicts a's 5 blocks: 4 stay in RAM, the oldest goes on to disk
  auto st = r.tiers->stats();
  EXPECT_EQ(st.ram_stores, 5);
  EXPECT_EQ(st.ram_evictions, 1);
  EXPECT_EQ(r.kv->find_cached_prefix(a, {}), 20);
  EXPECT_EQ(r.run(3, a), 20);  // everything but the last token, byte for byte (checked in run)
  st = r.tiers->stats();
  EXPECT_EQ(st.ram_hits + st.disk_hits, 5);
  EXPECT_GE(st.disk_hits, 1);
  EXPECT_EQ(r.kv->stats().tier_hit_tokens, 20);
  EXPECT_EQ(r.run(4, c), 0);
  EXPECT_EQ(r.run(5, b), 20);
  EXPECT_EQ(r.run(6, c), 20);
  EXPECT_EQ(r.run(7, a), 20);
  EXPECT_EQ(r.kv->stats().tier_load_failures, 0);
}

TEST(TieredKvStore, DiskOnlyTierAndRestart) {
  TempDir d;
  const Toks a = range(100, 21), b = range(200, 21);
  {
    Rig r(KvTierConfig{0, d.path.string(), 1 << 20, {1, 1}});
    EXPECT_EQ(r.run(1, a), 0);
    EXPECT_EQ(r.run(2, b), 0);
    EXPECT_EQ(r.run(3, a), 20);  // from disk (or its write queue)
    // Shutdown: the pool's cached blocks go to disk too.
    r.tiers->begin_persist();
    r.kv->flush_to_tier();
    r.tiers->persist();
  }
  Rig r(KvTierConfig{0, d.path.string(), 1 << 20, {1, 1}});
  EXPECT_GE(r.tiers->stats().disk_recovered, 10);
  EXPECT_EQ(r.run(1, b), 20);
  EXPECT_EQ(r.run(2, a), 20);
  // Another identity in the same directory: nothing to reuse.
  Rig other(KvTierConfig{0, d.path.string(), 1 << 20, {9, 9}});
  EXPECT_EQ(other.run(1, a), 0);
}

// A block that fails its check as it is loaded ends the hit there: shorter
// than find_cached_prefix() promised, never wrong.
TEST(TieredKvStore, DamagedBlockShortensTheHit) {
  TempDir d;
  Rig r(KvTierConfig{0, d.path.string(), 1 << 20, {1, 1}});
  const Toks a = range(100, 21), b = range(200, 21);
  r.a_to_disk(a, b);
  bool damaged = false;
  for (const auto& f : d.files(".kvb")) {
    std::ifstream in(f, std::ios::binary);
    std::vector<char> head(104 + 16);
    in.read(head.data(), (std::streamsize)head.size());
    TokenId first;
    std::memcpy(&first, head.data() + 104, 4);
    if (first != a[8]) continue;  // block 2 of a
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(-1, std::ios::end);
    io.put('\x42');
    damaged = true;
  }
  ASSERT_TRUE(damaged);
  EXPECT_EQ(r.kv->find_cached_prefix(a, {}), 20);
  EXPECT_EQ(r.run(3, a), 8);  // blocks 0 and 1; block 2 fails its payload checksum
  EXPECT_EQ(r.kv->stats().tier_load_failures, 1);
  EXPECT_EQ(r.tiers->stats().disk_corrupt, 1);
  EXPECT_EQ(r.kv->find_cached_prefix(a, {}), 20);  // recomputed and cached again
}

// The scheduler's view: a prompt whose tier blocks are still being read is
// not ready; once read, the hit loads them from memory.
TEST(TieredKvStore, PrefixIsReadyOnlyOnceItsDiskBlocksAreRead) {
  TempDir d;
  Rig r(KvTierConfig{0, d.path.string(), 1 << 20, {1, 1}});
  const Toks a = range(100, 21), b = range(200, 21);
  r.a_to_disk(a, b);
  EXPECT_TRUE(r.kv->prefix_ready(b, {}));  // b is in the pool
  EXPECT_FALSE(r.kv->prefix_ready(a, {}));  // its reads start now
  bool ready = false;
  for (int i = 0; i < 10000 && !ready; ++i) {
    ready = r.kv->prefix_ready(a, {});
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(ready);
  const int64_t staged = r.tiers->stats().disk_staged_reads;
  EXPECT_GE(staged, 1);
  EXPECT_EQ(r.run(3, a), 20);  // the bytes checked by Rig::run
  EXPECT_EQ(r.tiers->stats().disk_staged_loads, staged);
}

TEST(TieredKvStore, RejectsBudgetsThatHoldNoBlock) {
  KvStorage s = std::move(KvStorage::create(KvGeometry{2, 8, 4, KvType::f32}, 4).value());
  EXPECT_FALSE(TieredKvStore::create(KvTierConfig{100, "", 0, {}}, {&s}).ok());
  EXPECT_FALSE(TieredKvStore::create(KvTierConfig{0, "", 0, {}}, {&s}).ok());
  TempDir d;
  EXPECT_FALSE(TieredKvStore::create(KvTierConfig{0, d.path.string(), 10, {}}, {&s}).ok());
  KvStorage w = std::move(
      KvStorage::create(KvGeometry{2, 8, 4, KvType::f32, {0, 1}}, 4, 0, 4).value());  // a sliding-window pool
  EXPECT_FALSE(TieredKvStore::create(KvTierConfig{1 << 20, "", 0, {}}, {&w}).ok());
}

}  // namespace
}  // namespace serval
