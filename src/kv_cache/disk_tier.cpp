#include "kv_cache/disk_tier.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <system_error>

namespace serval {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'S', 'V', 'K', 'V', 'B', 'L', 'K', '1'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 104;  // through the header checksum; the token ids follow

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

void put64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }  // the file format is little-endian (x86-64)
void put32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
uint64_t get64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }
uint32_t get32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }

std::string hex128(const Hash128& h) {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)h.hi, (unsigned long long)h.lo);
  return buf;
}

// Reads up to n bytes at offset; returns the bytes read (short at end of file or on error).
size_t read_at(int fd, uint8_t* p, size_t n, off_t off) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, p + got, n - got, off + (off_t)got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  return got;
}

bool write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += (size_t)w;
  }
  return ::close(fd) == 0 && done == bytes.size();
}

}  // namespace

uint64_t checksum64(const uint8_t* p, size_t n) {
  constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full;
  uint64_t a = P1 + P2, b = P2, c = 0, d = 0 - P1;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = rotl(a + get64(p + i) * P2, 31) * P1;
    b = rotl(b + get64(p + i + 8) * P2, 31) * P1;
    c = rotl(c + get64(p + i + 16) * P2, 31) * P1;
    d = rotl(d + get64(p + i + 24) * P2, 31) * P1;
  }
  uint64_t h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18) + (uint64_t)n;
  for (; i < n; ++i) h = rotl(h ^ p[i], 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P1;
  h ^= h >> 32;
  return h;
}

Expected<std::unique_ptr<DiskTier>> DiskTier::open(const DiskTierConfig& cfg) {
  if (cfg.dir.empty()) return invalid_argument("--kv-cache-dir: empty path");
  if (cfg.block_size < 1 || cfg.payload_bytes == 0) return invalid_argument("disk tier: bad block layout");
  std::unique_ptr<DiskTier> t(new DiskTier(cfg));
  SERVAL_RETURN_IF_ERROR(t->init());
  t->writer_ = std::thread([p = t.get()] { p->writer_loop(); });
  t->reader_ = std::thread([p = t.get()] { p->reader_loop(); });
  return t;
}

DiskTier::~DiskTier() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  read_cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  if (reader_.joinable()) reader_.join();
}

size_t DiskTier::file_bytes() const {
  return kHeaderBytes + (size_t)cfg_.block_size * sizeof(TokenId) + cfg_.payload_bytes;
}

std::string DiskTier::path_of(const Hash128& h, const char* ext) const {
  return (fs::path(cfg_.dir) / (hex128(h) + ext)).string();
}

Status DiskTier::init() {
  std::error_code ec;
  fs::create_directories(cfg_.dir, ec);
  if (!fs::is_directory(cfg_.dir, ec))
    return invalid_argument("--kv-cache-dir " + cfg_.dir + ": not a directory that can be created");
  // The prefix-hash key: kept in the directory so chain hashes survive restarts.
  const std::string key_path = (fs::path(cfg_.dir) / "prefix-hash.key").string();
  uint8_t key[16];
  bool have_key = false;
  if (int fd = ::open(key_path.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
    have_key = read_at(fd, key, 16, 0) == 16 && fs::file_size(key_path, ec) == 16;
    ::close(fd);
  }
  if (!have_key) {
    std::random_device rd;
    for (auto& b : key) b = (uint8_t)rd();
    const std::string tmp = key_path + ".tmp";
    if (!write_file(tmp, std::vector<uint8_t>(key, key + 16)) || ::rename(tmp.c_str(), key_path.c_str()) != 0)
      return invalid_argument("--kv-cache-dir " + cfg_.dir + ": cannot write " + key_path + ": " +
                              std::strerror(errno));
  }
  k0_ = get64(key);
  k1_ = get64(key + 8);

  // Index the block files, oldest first.
  struct Found {
    fs::file_time_type mtime;
    OwnedBlockMeta meta;
  };
  std::vector<Found> found;
  const size_t head_bytes = kHeaderBytes + (size_t)cfg_.block_size * sizeof(TokenId);
  std::vector<uint8_t> head(head_bytes);
  for (fs::directory_iterator it(cfg_.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path p = it->path();
    const std::string ext = p.extension().string();
    if (ext == ".tmp") {  // a write that did not finish (the process died): never used
      fs::remove(p, ec);
      continue;
    }
    if (ext != ".kvb" || !it->is_regular_file(ec)) continue;
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const size_t got = read_at(fd, head.data(), head_bytes, 0);
    ::close(fd);
    OwnedBlockMeta meta;
    bool foreign = false;
    const bool ok = got == head_bytes && parse_header(head.data(), head_bytes, &meta, &foreign) &&
                    fs::file_size(p, ec) == file_bytes() && p.stem().string() == hex128(meta.hash);
    if (!ok) {
      if (foreign) {
        ++stats_.foreign;
      } else {
        ++stats_.corrupt;
        fs::remove(p, ec);
      }
      continue;
    }
    found.push_back({fs::last_write_time(p, ec), std::move(meta)});
  }
  std::stable_sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  for (Found& f : found) {
    const Hash128 h = f.meta.hash;
    if (index_.count(h)) continue;
    lru_.push_back(h);
    index_.emplace(h, Entry{std::move(f.meta), nullptr, std::prev(lru_.end()), 0, 0, nullptr});
    ++stats_.files;
    stats_.bytes += (int64_t)file_bytes();
    ++stats_.recovered;
  }
  while ((size_t)stats_.bytes > cfg_.budget_bytes && evict_one()) {
  }
  return {};
}

bool DiskTier::parse_header(const uint8_t* p, size_t n, OwnedBlockMeta* meta, bool* foreign) const {
  *foreign = true;
  const size_t head_bytes = kHeaderBytes + (size_t)cfg_.block_size * sizeof(TokenId);
  if (n < kHeaderBytes || std::memcmp(p, kMagic, 8) != 0 || get32(p + 8) != kVersion) return false;
  if (get64(p + 16) != cfg_.identity.lo || get64(p + 24) != cfg_.identity.hi) return false;
  *foreign = false;  // ours from here on: a mismatch is damage
  if (n < head_bytes || get32(p + 12) != (uint32_t)cfg_.block_size || get64(p + 80) != cfg_.payload_bytes)
    return false;
  // The header checksum covers the fields before it and the token ids.
  std::vector<uint8_t> covered(p, p + 96);
  covered.insert(covered.end(), p + kHeaderBytes, p + head_bytes);
  if (checksum64(covered.data(), covered.size()) != get64(p + 96)) return false;
  meta->hash = {get64(p + 32), get64(p + 40)};
  meta->parent = {get64(p + 48), get64(p + 56)};
  meta->key = {get64(p + 64), get64(p + 72)};
  meta->tokens.resize((size_t)cfg_.block_size);
  std::memcpy(meta->tokens.data(), p + kHeaderBytes, (size_t)cfg_.block_size * sizeof(TokenId));
  return true;
}

std::vector<uint8_t> DiskTier::image_of(const TierBlockMeta& m, const uint8_t* payload) const {
  const size_t tok_bytes = (size_t)cfg_.block_size * sizeof(TokenId);
  std::vector<uint8_t> img(file_bytes());
  uint8_t* p = img.data();
  std::memcpy(p, kMagic, 8);
  put32(p + 8, kVersion);
  put32(p + 12, (uint32_t)cfg_.block_size);
  put64(p + 16, cfg_.identity.lo);
  put64(p + 24, cfg_.identity.hi);
  put64(p + 32, m.hash.lo);
  put64(p + 40, m.hash.hi);
  put64(p + 48, m.parent.lo);
  put64(p + 56, m.parent.hi);
  put64(p + 64, m.key.salt);
  put64(p + 72, m.key.adapter_id);
  put64(p + 80, cfg_.payload_bytes);
  std::memcpy(p + kHeaderBytes, m.tokens.data(), tok_bytes);
  std::memcpy(p + kHeaderBytes + tok_bytes, payload, cfg_.payload_bytes);
  put64(p + 88, checksum64(p + kHeaderBytes + tok_bytes, cfg_.payload_bytes));
  std::vector<uint8_t> covered(p, p + 96);
  covered.insert(covered.end(), p + kHeaderBytes, p + kHeaderBytes + tok_bytes);
  put64(p + 96, checksum64(covered.data(), covered.size()));
  return img;
}

bool DiskTier::contains(const TierBlockMeta& m) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = index_.find(m.hash);
  return it != index_.end() && it->second.meta.names(m);
}

void DiskTier::touch(const TierBlockMeta& m) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = index_.find(m.hash);
  if (it == index_.end() || !it->second.meta.names(m)) return;
  lru_.splice(lru_.end(), lru_, it->second.lru);
}

void DiskTier::erase(std::unordered_map<Hash128, Entry, Hash128Hasher>::iterator it) {
  Entry& e = it->second;
  std::error_code ec;
  if (!e.pending) {
    fs::remove(path_of(it->first, ".kvb"), ec);
  } else {
    // Still queued: drop the job. Being written: the writer sees the entry
    // gone and deletes the file it made.
    auto j = std::find_if(jobs_.begin(), jobs_.end(), [&](const Job& x) { return x.image == e.pending; });
    if (j != jobs_.end()) {
      pending_bytes_ -= j->image->size();
      jobs_.erase(j);
      done_cv_.notify_all();
    }
  }
  if (e.staged) drop_staged(e), ++stats_.staged_drops;
  // A read still running finds its ticket gone and gives its bytes back.
  --stats_.files;
  if (e.pins > 0) --stats_.pinned;
  stats_.bytes -= (int64_t)file_bytes();
  lru_.erase(e.lru);
  index_.erase(it);
}

bool DiskTier::evict_one() {
  for (const Hash128& h : lru_) {
    auto it = index_.find(h);
    if (it->second.pins > 0) continue;
    erase(it);
    ++stats_.evictions;
    return true;
  }
  return false;
}

bool DiskTier::pin(const TierBlockMeta& m) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = index_.find(m.hash);
  if (it == index_.end() || !it->second.meta.names(m)) return false;
  if (it->second.pins++ == 0) ++stats_.pinned;
  lru_.splice(lru_.end(), lru_, it->second.lru);
  return true;
}

void DiskTier::unpin(const TierBlockMeta& m) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = index_.find(m.hash);
  if (it == index_.end() || !it->second.meta.names(m) || it->second.pins == 0) return;
  if (--it->second.pins == 0) --stats_.pinned;
}

bool DiskTier::store(const TierBlockMeta& m, const uint8_t* payload, bool blocking, bool pinned) {
  const size_t fb = file_bytes();
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = index_.find(m.hash);
    if (it != index_.end() && it->second.meta.names(m)) {
      lru_.splice(lru_.end(), lru_, it->second.lru);
      if (pinned && it->second.pins++ == 0) ++stats_.pinned;
      return true;
    }
    if (fb > cfg_.budget_bytes || (!blocking && pending_bytes_ + fb > cfg_.max_pending_bytes)) {
      ++stats_.write_drops;
      return false;
    }
  }
  auto image = std::make_shared<const std::vector<uint8_t>>(image_of(m, payload));
  std::unique_lock<std::mutex> lk(mu_);
  if (blocking)
    done_cv_.wait(lk, [&] { return pending_bytes_ + fb <= cfg_.max_pending_bytes || (jobs_.empty() && !writing_); });
  if (pending_bytes_ + fb > cfg_.max_pending_bytes && !(jobs_.empty() && !writing_)) {
    ++stats_.write_drops;
    return false;
  }
  if (auto it = index_.find(m.hash); it != index_.end()) {
    if (it->second.meta.names(m)) {  // stored meanwhile (by the writer's caller: this thread only; defensive)
      if (pinned && it->second.pins++ == 0) ++stats_.pinned;
      return true;
    }
    if (it->second.pins > 0) {  // a pinned block under this hash (a collision): keep it
      ++stats_.write_drops;
      return false;
    }
    erase(it);  // another block under this hash
  }
  while ((size_t)stats_.bytes + fb > cfg_.budget_bytes) {
    if (!evict_one()) {  // everything left is pinned
      ++stats_.write_drops;
      return false;
    }
  }
  lru_.push_back(m.hash);
  index_.emplace(m.hash, Entry{OwnedBlockMeta(m), image, std::prev(lru_.end()), pinned ? 1 : 0, 0, nullptr});
  if (pinned) ++stats_.pinned;
  ++stats_.files;
  stats_.bytes += (int64_t)fb;
  jobs_.push_back({m.hash, image});
  pending_bytes_ += fb;
  cv_.notify_one();
  return true;
}

bool DiskTier::read_file(const OwnedBlockMeta& want, uint8_t* payload) const {
  const size_t off = kHeaderBytes + (size_t)cfg_.block_size * sizeof(TokenId);
  std::vector<uint8_t> head(off);
  const int fd = ::open(path_of(want.hash, ".kvb").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  OwnedBlockMeta meta;
  bool foreign = false;
  bool ok = read_at(fd, head.data(), off, 0) == off && parse_header(head.data(), off, &meta, &foreign) &&
            meta.names(want.view()) && read_at(fd, payload, cfg_.payload_bytes, (off_t)off) == cfg_.payload_bytes &&
            checksum64(payload, cfg_.payload_bytes) == get64(head.data() + 88);
  uint8_t extra;
  ok = ok && read_at(fd, &extra, 1, (off_t)(off + cfg_.payload_bytes)) == 0;  // not longer than it should be
  ::close(fd);
  return ok;
}

void DiskTier::drop_staged(Entry& e) {
  e.staged.reset();
  e.read_ticket = 0;
  stats_.staged_bytes -= (int64_t)cfg_.payload_bytes;
}

bool DiskTier::queue_read(const Hash128& h, Entry& e) {
  const auto pb = (int64_t)cfg_.payload_bytes;
  const auto cap = (int64_t)cfg_.max_staged_bytes;
  // Room: the oldest staged copies go first (their requests came first and
  // are likely admitted by now; one loaded after all is read synchronously).
  while (stats_.staged_bytes + pb > cap && !staged_fifo_.empty()) {
    const auto [oh, ot] = staged_fifo_.front();
    staged_fifo_.pop_front();
    auto it = index_.find(oh);
    if (it != index_.end() && it->second.staged && it->second.read_ticket == ot) {
      drop_staged(it->second);
      ++stats_.staged_drops;
    }
  }
  if (stats_.staged_bytes + pb > cap) return false;  // the rest is being read
  e.read_ticket = next_ticket_++;
  stats_.staged_bytes += pb;
  ++stats_.prefetches;
  reads_.push_back({h, e.read_ticket, e.meta});
  read_cv_.notify_one();
  return true;
}

bool DiskTier::load(const TierBlockMeta& m, uint8_t* payload) {
  const size_t off = kHeaderBytes + (size_t)cfg_.block_size * sizeof(TokenId);
  std::shared_ptr<const std::vector<uint8_t>> image, staged;
  OwnedBlockMeta want;
  {
    std::unique_lock<std::mutex> lk(mu_);
    auto it = index_.find(m.hash);
    if (it == index_.end() || !it->second.meta.names(m)) return false;
    if (const uint64_t t = it->second.read_ticket; t && !it->second.staged) {
      // Its background read is running: wait for it rather than read twice.
      read_done_cv_.wait(lk, [&] {
        auto j = index_.find(m.hash);
        return j == index_.end() || j->second.read_ticket != t || j->second.staged;
      });
      it = index_.find(m.hash);
      if (it == index_.end() || !it->second.meta.names(m)) return false;  // it failed its check (counted)
    }
    Entry& e = it->second;
    image = e.pending;
    if (e.staged) {
      staged = e.staged;
      drop_staged(e);
      ++stats_.staged_loads;
    }
    want = e.meta;
    lru_.splice(lru_.end(), lru_, e.lru);
  }
  if (staged) {  // read and checked by the reader thread
    std::memcpy(payload, staged->data(), cfg_.payload_bytes);
    return true;
  }
  if (image) {  // not on disk yet: the queued image is the same bytes
    std::memcpy(payload, image->data() + off, cfg_.payload_bytes);
    return true;
  }
  if (read_file(want, payload)) return true;
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = index_.find(m.hash); it != index_.end() && !it->second.pending) {
    erase(it);
    ++stats_.corrupt;
  }
  return false;
}

void DiskTier::prefetch(const TierBlockMeta& m) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = index_.find(m.hash);
    if (it == index_.end() || !it->second.meta.names(m) || it->second.pending || it->second.read_ticket) return;
    if (queue_read(it->first, it->second)) return;
  }
  // No room to stage it: at least the kernel reads it ahead.
  if (const int fd = ::open(path_of(m.hash, ".kvb").c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
    ::close(fd);
  }
}

bool DiskTier::ready(const TierBlockMeta& m) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = index_.find(m.hash);
  if (it == index_.end() || !it->second.meta.names(m)) return true;  // a miss costs nothing
  Entry& e = it->second;
  if (e.pending) return true;                     // its image is in memory
  if (e.read_ticket) return e.staged != nullptr;  // being read, or read
  return !queue_read(it->first, e);               // queued now; without room, load() reads it
}

void DiskTier::reader_loop() {
  const size_t pb = cfg_.payload_bytes;
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    read_cv_.wait(lk, [&] { return stop_ || !reads_.empty(); });
    if (stop_) break;
    Read r = std::move(reads_.front());
    reads_.pop_front();
    lk.unlock();
    auto buf = std::make_shared<std::vector<uint8_t>>(pb);
    const bool ok = read_file(r.meta, buf->data());
    lk.lock();
    auto it = index_.find(r.hash);
    if (it == index_.end() || it->second.read_ticket != r.ticket) {
      stats_.staged_bytes -= (int64_t)pb;  // evicted (or replaced) while it was read
      ++stats_.staged_drops;
    } else if (!ok) {
      it->second.read_ticket = 0;
      stats_.staged_bytes -= (int64_t)pb;
      if (!it->second.pending) {
        erase(it);
        ++stats_.corrupt;
      }
    } else {
      it->second.staged = std::move(buf);
      ++stats_.staged_reads;
      staged_fifo_.emplace_back(r.hash, r.ticket);
      // Entries consumed or dropped since stay in the FIFO until popped: prune.
      if (staged_fifo_.size() > 2 * (cfg_.max_staged_bytes / pb) + 64) {
        std::erase_if(staged_fifo_, [&](const auto& x) {
          auto j = index_.find(x.first);
          return j == index_.end() || !j->second.staged || j->second.read_ticket != x.second;
        });
      }
    }
    read_done_cv_.notify_all();
  }
}

void DiskTier::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return jobs_.empty() && !writing_; });
}

DiskTier::Stats DiskTier::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void DiskTier::writer_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) break;  // stop_, and every queued write is done
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    writing_ = true;
    lk.unlock();
    const std::string tmp = path_of(job.hash, ".tmp"), final_path = path_of(job.hash, ".kvb");
    bool ok = write_file(tmp, *job.image) && ::rename(tmp.c_str(), final_path.c_str()) == 0;
    std::error_code ec;
    if (!ok) fs::remove(tmp, ec);
    lk.lock();
    writing_ = false;
    pending_bytes_ -= job.image->size();
    auto it = index_.find(job.hash);
    if (it != index_.end() && it->second.pending == job.image) {
      if (ok) {
        it->second.pending.reset();
        ++stats_.writes;
      } else {
        ++stats_.write_drops;
        erase(it);
      }
    } else if (ok && it == index_.end()) {
      fs::remove(final_path, ec);  // evicted while it was being written
    }
    done_cv_.notify_all();
  }
}

}  // namespace serval
