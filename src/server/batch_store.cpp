#include "server/batch_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

namespace serval::server {

namespace fs = std::filesystem;

std::string new_object_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[64];
  const unsigned long long a = rng(), b = rng();
  std::snprintf(buf, sizeof buf, "%s%016llx%08llx", prefix, a, b & 0xffffffffull);
  return buf;
}

int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

uint64_t fnv1a64(std::string_view bytes, uint64_t h) {
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

Status write_file_atomic(const std::string& path, std::string_view bytes, bool fsync_it) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return io_error("cannot create '" + tmp + "'");
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      return io_error("cannot write '" + tmp + "' (disk full?)");
    }
    off += (size_t)n;
  }
  if (fsync_it && ::fsync(fd) != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return io_error("cannot fsync '" + tmp + "'");
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return io_error("cannot rename '" + tmp + "' to '" + path + "'");
  }
  if (fsync_it) {  // the rename itself: fsync the folder
    const int dfd = ::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  return {};
}

namespace {

// A prepared statement; finalized on scope exit. Bind indexes are 1-based.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) {
    if (sqlite3_prepare_v2(db, sql, -1, &s_, nullptr) != SQLITE_OK) s_ = nullptr;
  }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return s_ != nullptr; }
  Stmt& bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), (int)v.size(), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  int step() { return s_ ? sqlite3_step(s_) : SQLITE_MISUSE; }
  void reset() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  std::string text(int col) const {
    const unsigned char* t = sqlite3_column_text(s_, col);
    return t ? std::string((const char*)t, (size_t)sqlite3_column_bytes(s_, col)) : std::string();
  }
  int64_t integer(int col) const { return sqlite3_column_int64(s_, col); }

 private:
  sqlite3_stmt* s_ = nullptr;
};

Status db_error(sqlite3* db, const std::string& what) {
  return io_error("batch database: " + what + ": " + (db ? sqlite3_errmsg(db) : "no connection"));
}

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS files (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT UNIQUE NOT NULL, owner TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
  bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, path TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT UNIQUE NOT NULL, owner TEXT NOT NULL, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
  completion_window TEXT NOT NULL, metadata TEXT NOT NULL, status TEXT NOT NULL, errors TEXT NOT NULL,
  output_file_id TEXT NOT NULL, error_file_id TEXT NOT NULL, output_path TEXT NOT NULL, error_path TEXT NOT NULL,
  total INTEGER NOT NULL, created_at INTEGER NOT NULL, in_progress_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
  finalizing_at INTEGER NOT NULL, completed_at INTEGER NOT NULL, failed_at INTEGER NOT NULL,
  expired_at INTEGER NOT NULL, cancelling_at INTEGER NOT NULL, cancelled_at INTEGER NOT NULL,
  input_hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS lines (
  batch_id TEXT NOT NULL, line INTEGER NOT NULL, custom_id TEXT NOT NULL, ok INTEGER NOT NULL,
  record TEXT NOT NULL, completion_tokens INTEGER NOT NULL,
  PRIMARY KEY (batch_id, line)) WITHOUT ROWID;
)sql";

constexpr const char* kBatchCols =
    "id, owner, endpoint, input_file_id, completion_window, metadata, status, errors, output_file_id, error_file_id, "
    "output_path, error_path, total, created_at, in_progress_at, expires_at, finalizing_at, completed_at, failed_at, "
    "expired_at, cancelling_at, cancelled_at, input_hash";

BatchRecord read_batch(const Stmt& s) {
  BatchRecord b;
  b.id = s.text(0);
  b.owner = s.text(1);
  b.endpoint = s.text(2);
  b.input_file_id = s.text(3);
  b.completion_window = s.text(4);
  b.metadata_json = s.text(5);
  b.status = s.text(6);
  b.errors_json = s.text(7);
  b.output_file_id = s.text(8);
  b.error_file_id = s.text(9);
  b.output_path = s.text(10);
  b.error_path = s.text(11);
  b.total = s.integer(12);
  b.created_at = s.integer(13);
  b.in_progress_at = s.integer(14);
  b.expires_at = s.integer(15);
  b.finalizing_at = s.integer(16);
  b.completed_at = s.integer(17);
  b.failed_at = s.integer(18);
  b.expired_at = s.integer(19);
  b.cancelling_at = s.integer(20);
  b.cancelled_at = s.integer(21);
  b.input_hash = std::strtoull(s.text(22).c_str(), nullptr, 16);
  return b;
}

FileRecord read_file_row(const Stmt& s) {
  FileRecord f;
  f.id = s.text(0);
  f.owner = s.text(1);
  f.filename = s.text(2);
  f.purpose = s.text(3);
  f.bytes = s.integer(4);
  f.created_at = s.integer(5);
  f.path = s.text(6);
  return f;
}

std::string hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", (unsigned long long)v);
  return buf;
}

}  // namespace

Expected<std::unique_ptr<BatchStore>> BatchStore::open(Options opt) {
  std::error_code ec;
  fs::create_directories(opt.files_dir ? fs::path(opt.dir) / "files" : fs::path(opt.dir), ec);
  if (ec) return io_error("batch folder '" + opt.dir + "': " + ec.message());
  if (opt.db_path.empty()) opt.db_path = (fs::path(opt.dir) / "batch.db").string();
  std::unique_ptr<BatchStore> s(new BatchStore(std::move(opt)));
  // One process per store: two runners over one database would run every line twice.
  const std::string lock_path = s->opt_.db_path + ".lock";
  s->lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (s->lock_fd_ < 0) return io_error("cannot create '" + lock_path + "'");
  if (::flock(s->lock_fd_, LOCK_EX | LOCK_NB) != 0)
    return io_error("'" + s->opt_.db_path + "' is in use by another serval process (lock " + lock_path + ")");
  if (sqlite3_open_v2(s->opt_.db_path.c_str(), &s->db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr) != SQLITE_OK)
    return db_error(s->db_, "open '" + s->opt_.db_path + "'");
  sqlite3_busy_timeout(s->db_, 5000);
  if (auto st = s->exec("PRAGMA journal_mode=WAL"); !st.ok()) return st;
  if (auto st = s->exec(s->opt_.durable_fsync ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL"); !st.ok())
    return st;
  if (auto st = s->exec(kSchema); !st.ok()) return st;
  return s;
}

BatchStore::~BatchStore() {
  sqlite3_close(db_);
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

Status BatchStore::exec(const char* sql) const {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "unknown error";
    sqlite3_free(err);
    return io_error(std::string("batch database: ") + m);
  }
  return {};
}

std::string BatchStore::path_for(const std::string& file_id) const {
  return (fs::path(opt_.dir) / "files" / file_id).string();
}

Expected<FileRecord> BatchStore::insert_file(const FileRecord& f) {
  Stmt s(db_, "INSERT INTO files (id, owner, filename, purpose, bytes, created_at, path) VALUES (?,?,?,?,?,?,?)");
  s.bind(1, f.id).bind(2, f.owner).bind(3, f.filename).bind(4, f.purpose).bind(5, f.bytes).bind(6, f.created_at).bind(7, f.path);
  if (s.step() != SQLITE_DONE) return db_error(db_, "insert file");
  return f;
}

Expected<FileRecord> BatchStore::add_file(const std::string& owner, const std::string& filename,
                                          const std::string& purpose, std::string_view content) {
  FileRecord f;
  f.id = new_object_id("file-");
  f.owner = owner;
  f.filename = filename;
  f.purpose = purpose;
  f.bytes = (int64_t)content.size();
  f.created_at = unix_seconds();
  f.path = path_for(f.id);
  if (auto st = write_file_atomic(f.path, content, opt_.durable_fsync); !st.ok()) return st;
  std::lock_guard<std::mutex> lk(mu_);
  auto r = insert_file(f);
  if (!r.ok()) ::unlink(f.path.c_str());
  return r;
}

Expected<FileRecord> BatchStore::add_file_record(const FileRecord& f) {
  std::lock_guard<std::mutex> lk(mu_);
  return insert_file(f);
}

Expected<FileRecord> BatchStore::add_file_ref(const std::string& owner, const std::string& path, int64_t bytes) {
  FileRecord f;
  f.id = new_object_id("file-");
  f.owner = owner;
  f.filename = fs::path(path).filename().string();
  f.purpose = "batch";
  f.bytes = bytes;
  f.created_at = unix_seconds();
  f.path = path;
  std::lock_guard<std::mutex> lk(mu_);
  return insert_file(f);
}

std::optional<FileRecord> BatchStore::file(const std::string& owner, const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt s(db_, "SELECT id, owner, filename, purpose, bytes, created_at, path FROM files WHERE id = ? AND owner = ?");
  s.bind(1, id).bind(2, owner);
  if (s.step() != SQLITE_ROW) return std::nullopt;
  return read_file_row(s);
}

std::vector<FileRecord> BatchStore::list_files(const std::string& owner, const std::string& purpose,
                                               const ListPage& page, bool ascending, bool* has_more) const {
  std::lock_guard<std::mutex> lk(mu_);
  // The cursor is the sequence number of the `after` id (0 / max when absent or unknown).
  int64_t cursor = ascending ? 0 : INT64_MAX;
  if (!page.after.empty()) {
    Stmt c(db_, "SELECT seq FROM files WHERE id = ? AND owner = ?");
    c.bind(1, page.after).bind(2, owner);
    if (c.step() == SQLITE_ROW) cursor = c.integer(0);
  }
  const std::string sql = std::string("SELECT id, owner, filename, purpose, bytes, created_at, path FROM files ") +
                          "WHERE owner = ? AND (? = '' OR purpose = ?) AND seq " + (ascending ? ">" : "<") +
                          " ? ORDER BY seq " + (ascending ? "ASC" : "DESC") + " LIMIT ?";
  Stmt s(db_, sql.c_str());
  s.bind(1, owner).bind(2, purpose).bind(3, purpose).bind(4, cursor).bind(5, (int64_t)page.limit + 1);
  std::vector<FileRecord> out;
  while (s.step() == SQLITE_ROW) out.push_back(read_file_row(s));
  *has_more = out.size() > page.limit;
  if (*has_more) out.pop_back();
  return out;
}

Status BatchStore::delete_file(const std::string& owner, const std::string& id) {
  std::optional<FileRecord> f = file(owner, id);
  if (!f) return not_found("no file '" + id + "'");
  {
    std::lock_guard<std::mutex> lk(mu_);
    Stmt s(db_, "DELETE FROM files WHERE id = ? AND owner = ?");
    s.bind(1, id).bind(2, owner);
    if (s.step() != SQLITE_DONE) return db_error(db_, "delete file");
  }
  // Only bytes this store wrote are removed (never an offline input).
  if (fs::path(f->path).parent_path() == fs::path(opt_.dir) / "files") ::unlink(f->path.c_str());
  return {};
}

Expected<BatchRecord> BatchStore::add_batch(BatchRecord b) {
  if (b.id.empty()) b.id = new_object_id("batch_");
  if (b.created_at == 0) b.created_at = unix_seconds();
  std::lock_guard<std::mutex> lk(mu_);
  const std::string sql = std::string("INSERT INTO batches (") + kBatchCols +
                          ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)";
  Stmt s(db_, sql.c_str());
  s.bind(1, b.id).bind(2, b.owner).bind(3, b.endpoint).bind(4, b.input_file_id).bind(5, b.completion_window);
  s.bind(6, b.metadata_json).bind(7, b.status).bind(8, b.errors_json).bind(9, b.output_file_id).bind(10, b.error_file_id);
  s.bind(11, b.output_path).bind(12, b.error_path).bind(13, b.total).bind(14, b.created_at).bind(15, b.in_progress_at);
  s.bind(16, b.expires_at).bind(17, b.finalizing_at).bind(18, b.completed_at).bind(19, b.failed_at);
  s.bind(20, b.expired_at).bind(21, b.cancelling_at).bind(22, b.cancelled_at).bind(23, hex64(b.input_hash));
  if (s.step() != SQLITE_DONE) return db_error(db_, "insert batch");
  return b;
}

std::optional<BatchRecord> BatchStore::batch(const std::string& owner, const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  const std::string sql = std::string("SELECT ") + kBatchCols + " FROM batches WHERE id = ? AND (? = '' OR owner = ?)";
  Stmt s(db_, sql.c_str());
  s.bind(1, id).bind(2, owner).bind(3, owner);
  if (s.step() != SQLITE_ROW) return std::nullopt;
  return read_batch(s);
}

std::vector<BatchRecord> BatchStore::list_batches(const std::string& owner, const ListPage& page, bool* has_more) const {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t cursor = INT64_MAX;
  if (!page.after.empty()) {
    Stmt c(db_, "SELECT seq FROM batches WHERE id = ? AND owner = ?");
    c.bind(1, page.after).bind(2, owner);
    if (c.step() == SQLITE_ROW) cursor = c.integer(0);
  }
  const std::string sql =
      std::string("SELECT ") + kBatchCols + " FROM batches WHERE owner = ? AND seq < ? ORDER BY seq DESC LIMIT ?";
  Stmt s(db_, sql.c_str());
  s.bind(1, owner).bind(2, cursor).bind(3, (int64_t)page.limit + 1);
  std::vector<BatchRecord> out;
  while (s.step() == SQLITE_ROW) out.push_back(read_batch(s));
  *has_more = out.size() > page.limit;
  if (*has_more) out.pop_back();
  return out;
}

std::vector<BatchRecord> BatchStore::batches_in(const std::vector<std::string>& statuses) const {
  std::lock_guard<std::mutex> lk(mu_);
  const std::string sql = std::string("SELECT ") + kBatchCols + " FROM batches WHERE status = ? ORDER BY seq ASC";
  std::vector<BatchRecord> out;
  Stmt s(db_, sql.c_str());
  for (const std::string& st : statuses) {
    s.reset();
    s.bind(1, st);
    while (s.step() == SQLITE_ROW) out.push_back(read_batch(s));
  }
  std::sort(out.begin(), out.end(), [](const BatchRecord& a, const BatchRecord& b) { return a.created_at < b.created_at; });
  return out;
}

std::vector<std::string> BatchStore::batches_using(const std::string& file_id) const {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt s(db_,
         "SELECT id FROM batches WHERE input_file_id = ? AND status IN ('validating', 'in_progress', 'finalizing', "
         "'cancelling')");
  s.bind(1, file_id);
  std::vector<std::string> out;
  while (s.step() == SQLITE_ROW) out.push_back(s.text(0));
  return out;
}

Expected<bool> BatchStore::update_batch(const BatchRecord& b, const std::string& expected) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt s(db_,
         "UPDATE batches SET status = ?, errors = ?, output_file_id = ?, error_file_id = ?, total = ?, "
         "in_progress_at = ?, expires_at = ?, finalizing_at = ?, completed_at = ?, failed_at = ?, expired_at = ?, "
         "cancelling_at = ?, cancelled_at = ?, input_hash = ? WHERE id = ? AND status = ?");
  s.bind(1, b.status).bind(2, b.errors_json).bind(3, b.output_file_id).bind(4, b.error_file_id).bind(5, b.total);
  s.bind(6, b.in_progress_at).bind(7, b.expires_at).bind(8, b.finalizing_at).bind(9, b.completed_at);
  s.bind(10, b.failed_at).bind(11, b.expired_at).bind(12, b.cancelling_at).bind(13, b.cancelled_at);
  s.bind(14, hex64(b.input_hash)).bind(15, b.id).bind(16, expected);
  if (s.step() != SQLITE_DONE) return db_error(db_, "update batch");
  return sqlite3_changes(db_) > 0;
}

Expected<bool> BatchStore::transition(const std::string& id, const std::string& from, const std::string& to,
                                      int64_t now) {
  static const char* const kStamp[][2] = {{"in_progress", "in_progress_at"}, {"finalizing", "finalizing_at"},
                                          {"completed", "completed_at"},     {"failed", "failed_at"},
                                          {"expired", "expired_at"},         {"cancelling", "cancelling_at"},
                                          {"cancelled", "cancelled_at"}};
  std::string col;
  for (const auto& p : kStamp)
    if (to == p[0]) col = p[1];
  std::lock_guard<std::mutex> lk(mu_);
  const std::string sql = "UPDATE batches SET status = ?" + (col.empty() ? std::string() : ", " + col + " = ?") +
                          " WHERE id = ? AND status = ?";
  Stmt s(db_, sql.c_str());
  int i = 1;
  s.bind(i++, to);
  if (!col.empty()) s.bind(i++, now);
  s.bind(i, id);
  s.bind(i + 1, from);
  if (s.step() != SQLITE_DONE) return db_error(db_, "batch transition");
  return sqlite3_changes(db_) > 0;
}

Status BatchStore::commit_lines(const std::string& batch_id, const std::vector<LineOutcome>& lines) {
  if (lines.empty()) return {};
  std::lock_guard<std::mutex> lk(mu_);
  if (auto st = exec("BEGIN IMMEDIATE"); !st.ok()) return st;
  Stmt s(db_,
         "INSERT OR IGNORE INTO lines (batch_id, line, custom_id, ok, record, completion_tokens) VALUES (?,?,?,?,?,?)");
  for (const LineOutcome& l : lines) {
    s.reset();
    s.bind(1, batch_id).bind(2, l.line).bind(3, l.custom_id).bind(4, (int64_t)l.ok).bind(5, l.record);
    s.bind(6, l.completion_tokens);
    if (s.step() != SQLITE_DONE) {
      Status err = db_error(db_, "insert line");
      exec("ROLLBACK");
      return err;
    }
  }
  return exec("COMMIT");
}

std::vector<int64_t> BatchStore::done_lines(const std::string& batch_id) const {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt s(db_, "SELECT line FROM lines WHERE batch_id = ? ORDER BY line");
  s.bind(1, batch_id);
  std::vector<int64_t> out;
  while (s.step() == SQLITE_ROW) out.push_back(s.integer(0));
  return out;
}

RequestCounts BatchStore::counts(const std::string& batch_id, int64_t total) const {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt s(db_, "SELECT ok, COUNT(*) FROM lines WHERE batch_id = ? GROUP BY ok");
  s.bind(1, batch_id);
  RequestCounts c;
  c.total = total;
  while (s.step() == SQLITE_ROW) (s.integer(0) ? c.completed : c.failed) = s.integer(1);
  return c;
}

int64_t BatchStore::completion_tokens(const std::string& batch_id) const {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt s(db_, "SELECT COALESCE(SUM(completion_tokens), 0) FROM lines WHERE batch_id = ?");
  s.bind(1, batch_id);
  return s.step() == SQLITE_ROW ? s.integer(0) : 0;
}

Expected<int64_t> BatchStore::write_results(const std::string& batch_id, bool ok, const std::string& path) const {
  std::string out;
  {
    std::lock_guard<std::mutex> lk(mu_);
    Stmt s(db_, "SELECT record FROM lines WHERE batch_id = ? AND ok = ? ORDER BY line");
    s.bind(1, batch_id).bind(2, (int64_t)ok);
    int rc;
    while ((rc = s.step()) == SQLITE_ROW) {
      out += s.text(0);
      out += '\n';
    }
    if (rc != SQLITE_DONE) return db_error(db_, "read lines");
  }
  if (auto st = write_file_atomic(path, out, opt_.durable_fsync); !st.ok()) return st;
  return (int64_t)out.size();
}

}  // namespace serval::server
