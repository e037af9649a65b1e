// DiskTier: the disk tier of the prefix cache — one file per full block in a
// directory, an LRU under a byte budget, writes on a background thread, and
// an index rebuilt from the directory at start so that a restarted server
// finds the prefixes of the last one.
//
// File `<chain hash, 32 hex>.kvb`:
//   header   magic "SVKVBLK1", version, block_size, identity (128 bits: model
//            file, KV type and layout; tiered_store.h), chain hash, parent
//            hash, PrefixKey, payload size, payload checksum, header checksum
//   tokens   block_size token ids (int32, little-endian)
//   payload  the block's KV bytes (TieredKvStore's layout)
// A file is written as `<name>.tmp` and renamed into place, so a process
// killed mid-write leaves only a .tmp file, which the next start deletes.
// A .kvb file is used only if its header checksum, identity, sizes and name
// agree (checked at start) and its payload checksum matches (checked on every
// load); a file of another identity is foreign (counted, left alone, outside
// the budget); a bad file of ours is counted and deleted. Not fsync'ed: a
// power loss can leave a file whose checksum then fails, never a wrong hit.
//
// The directory also keeps the prefix-cache hash key (`prefix-hash.key`), so
// chain hashes stay the same across restarts (hash_key()).
//
// Promotion off the engine thread: prefetch() (a request has arrived) queues
// a background read of the block's file; a reader thread reads and checks it
// (header, token ids, payload checksum) into a staged copy in memory, so that
// load() is a memcpy. ready() tells the scheduler whether load() would wait
// on the disk, so a request waits only for its own blocks. Staged copies are
// bounded (max_staged_bytes; the oldest are dropped for newer reads, and are
// then read synchronously if they are loaded after all).
//
// Thread safety: every public method is called by one thread (the engine
// loop); the writer and reader threads are internal.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kv_cache/ram_tier.h"

namespace serval {

struct DiskTierConfig {
  std::string dir;
  size_t budget_bytes = 0;    // files on disk + writes queued, at most
  Hash128 identity;           // files of another identity are foreign
  int32_t block_size = 16;
  size_t payload_bytes = 0;   // KV bytes per block
  size_t max_pending_bytes = 64u << 20;  // queued writes beyond this are dropped (counted)
  size_t max_staged_bytes = 256u << 20;  // payloads read ahead and held for load(), at most
};

class DiskTier {
 public:
  struct Stats {
    int64_t files = 0;          // blocks held (on disk or being written)
    int64_t bytes = 0;          // their file bytes
    int64_t writes = 0;         // files written
    int64_t write_drops = 0;    // stores dropped: the write queue was full, or a write failed
    int64_t evictions = 0;      // files deleted to stay in the budget
    int64_t corrupt = 0;        // files of ours that failed a check (deleted)
    int64_t foreign = 0;        // files of another identity or format (ignored)
    int64_t recovered = 0;      // files indexed at start
    int64_t pinned = 0;         // entries holding a pin
    int64_t prefetches = 0;     // background reads queued for arriving requests
    int64_t staged_reads = 0;   // of them, read and checked into memory
    int64_t staged_loads = 0;   // loads served from a staged copy (no disk read on the engine thread)
    int64_t staged_drops = 0;   // staged copies dropped unused (for newer reads, or their file evicted)
    int64_t staged_bytes = 0;   // bytes staged or being read now
  };

  // Creates the directory if needed, loads or makes the hash key, deletes
  // leftover .tmp files and indexes the .kvb files (oldest first in the LRU).
  static Expected<std::unique_ptr<DiskTier>> open(const DiskTierConfig& cfg);
  ~DiskTier();  // finishes the queued writes, then stops the writer
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  size_t file_bytes() const;  // bytes of one block's file
  uint64_t hash_k0() const { return k0_; }
  uint64_t hash_k1() const { return k1_; }

  bool contains(const TierBlockMeta& m) const;
  void touch(const TierBlockMeta& m);
  // Queues a write of m's payload (copied), evicting least recently used
  // unpinned files to stay within the budget. With blocking set, waits for
  // room in the write queue instead of dropping; with pinned, the new entry
  // holds one pin. False when it was not stored (queue full, or no unpinned
  // file left to evict). An entry held already is touched (and pinned).
  bool store(const TierBlockMeta& m, const uint8_t* payload, bool blocking = false, bool pinned = false);
  // Pins: a pinned entry is never evicted (saved sessions). pin() adds one
  // to an entry held (false if not held); unpin() drops one. In memory only:
  // the owner of the pins re-pins after a restart.
  bool pin(const TierBlockMeta& m);
  void unpin(const TierBlockMeta& m);
  // Reads and checks m's file into payload (payload_bytes). False when it is
  // not held or fails a check (then it is deleted and counted).
  bool load(const TierBlockMeta& m, uint8_t* payload);
  // Queues a background read of m's file into a staged copy (checked), so
  // that load() copies from memory. No-op if not held, still being written
  // (its image is in memory), or staged or being read already.
  void prefetch(const TierBlockMeta& m);
  // Would load(m) return without reading the disk? False while m's background
  // read is queued or running; a held block neither staged nor being read
  // gets its read queued (and false). True for blocks not held (a miss).
  bool ready(const TierBlockMeta& m);
  // Waits until every queued write is on disk.
  void drain();
  Stats stats() const;

 private:
  struct Entry {
    OwnedBlockMeta meta;
    std::shared_ptr<const std::vector<uint8_t>> pending;  // the file image while it is being written
    std::list<Hash128>::iterator lru;
    int32_t pins = 0;
    uint64_t read_ticket = 0;  // nonzero while a background read is queued, running or staged
    std::shared_ptr<const std::vector<uint8_t>> staged;  // its payload, read and checked
  };
  struct Read {
    Hash128 hash;
    uint64_t ticket;
    OwnedBlockMeta meta;
  };
  struct Job {
    Hash128 hash;
    std::shared_ptr<const std::vector<uint8_t>> image;
  };

  explicit DiskTier(const DiskTierConfig& cfg) : cfg_(cfg) {}
  Status init();
  std::string path_of(const Hash128& h, const char* ext) const;
  std::vector<uint8_t> image_of(const TierBlockMeta& m, const uint8_t* payload) const;
  // Checks a file's header and token ids; *meta gets its name. Returns false
  // for foreign (another identity/format: *foreign set) and bad files.
  bool parse_header(const uint8_t* p, size_t n, OwnedBlockMeta* meta, bool* foreign) const;
  bool evict_one();  // the least recently used unpinned entry; false if none (mu_ held)
  void erase(std::unordered_map<Hash128, Entry, Hash128Hasher>::iterator it);  // mu_ held
  void writer_loop();
  void reader_loop();
  // Queues m's read if there is room for its payload (dropping older staged
  // copies if need be); false if not (mu_ held).
  bool queue_read(const Hash128& h, Entry& e);
  void drop_staged(Entry& e);  // mu_ held
  // Reads and checks the file of `meta` (named hash) into payload.
  bool read_file(const OwnedBlockMeta& meta, uint8_t* payload) const;
  DiskTierConfig cfg_;
  uint64_t k0_ = 0, k1_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // writer: jobs or stop
  std::condition_variable done_cv_;  // drain / blocking store: a job finished
  std::unordered_map<Hash128, Entry, Hash128Hasher> index_;
  std::list<Hash128> lru_;  // least recently used first
  std::deque<Job> jobs_;
  size_t pending_bytes_ = 0;
  bool writing_ = false;
  bool stop_ = false;
  Stats stats_;
  std::thread writer_;
  // Background reads (promotion): queued reads, staged copies oldest first.
  std::condition_variable read_cv_;       // reader: reads or stop
  std::condition_variable read_done_cv_;  // load(): a read finished
  std::deque<Read> reads_;
  std::deque<std::pair<Hash128, uint64_t>> staged_fifo_;
  uint64_t next_ticket_ = 1;
  std::thread reader_;
};

// A fast 64-bit checksum of bytes (not cryptographic: detects damaged files).
uint64_t checksum64(const uint8_t* p, size_t n);

}  // namespace serval
