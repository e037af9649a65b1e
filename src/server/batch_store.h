// Durable state of the Files and Batches APIs (and of `serval batch`): an
// SQLite database in WAL mode plus a folder of uploaded files.
//
// Exactly-once: a batch line's outcome is one row keyed by (batch, line
// number), inserted with INSERT OR IGNORE inside a transaction; a line counts
// as done only once that transaction committed. After a crash or SIGKILL the
// committed rows are all there (WAL with synchronous=NORMAL survives a process
// crash; synchronous=FULL, `durable_fsync`, also a power loss), so a restarted
// runner re-runs exactly the lines with no row. Output and error files are
// built from the rows in line order, written to a temporary name and renamed.
//
// Ownership: every file and batch has an owner (a tenant id derived from the
// API key, never the key itself); reads by another owner see nothing (the
// API answers 404).
//
// Threads: thread-safe; one connection behind a mutex. Calls are short
// (microseconds to a few ms); large file contents are read and written
// outside the database.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

struct sqlite3;

namespace serval::server {

struct FileRecord {
  std::string id;        // "file-<hex>"
  std::string owner;
  std::string filename;  // as uploaded (bounded, no control characters)
  std::string purpose;   // "batch", "batch_output"
  int64_t bytes = 0;
  int64_t created_at = 0;  // unix seconds
  std::string path;        // where the bytes are (inside the files folder, or the user's file for `serval batch`)
};

struct BatchRecord {
  std::string id;  // "batch_<hex>"
  std::string owner;
  std::string endpoint;  // "/v1/chat/completions" | "/v1/completions" | "*" (offline: each line's url)
  std::string input_file_id;
  std::string completion_window = "24h";
  std::string metadata_json = "null";  // an object of strings, or null
  std::string status = "validating";   // validating in_progress finalizing completed failed cancelling cancelled expired
  std::string errors_json = "null";    // a failed validation: {"object":"list","data":[{code,message,line}]}
  std::string output_file_id, error_file_id;
  // Offline (`serval batch`): results go to these paths instead of new file records.
  std::string output_path, error_path;
  int64_t total = 0;  // lines in the input (set by validation)
  int64_t created_at = 0, in_progress_at = 0, expires_at = 0, finalizing_at = 0, completed_at = 0, failed_at = 0,
          expired_at = 0, cancelling_at = 0, cancelled_at = 0;  // unix seconds; 0 = not yet
  uint64_t input_hash = 0;  // FNV-1a of the input's bytes at validation (offline resume checks it)
};

struct LineOutcome {
  int64_t line = 0;        // 1-based line number in the input file
  std::string custom_id;   // empty when the line had none
  bool ok = false;         // true: the output file; false: the error file
  std::string record;      // the whole output/error line (JSON, no newline)
  int64_t completion_tokens = 0;
};

struct RequestCounts {
  int64_t total = 0, completed = 0, failed = 0;
};

struct ListPage {
  size_t limit = 20;    // 1..100
  std::string after;    // cursor: an id from a previous page (items after it in list order)
};

class BatchStore {
 public:
  struct Options {
    std::string dir;               // holds batch.db and files/ (created if missing)
    std::string db_path;           // empty: dir/batch.db
    bool durable_fsync = false;    // synchronous=FULL and fsync of written files
    bool files_dir = true;         // false (offline): no files/ folder; only add_file_ref
  };
  // Errors: io_error when the folder or database cannot be created or opened,
  // or another process holds the store (an exclusive lock beside the database).
  static Expected<std::unique_ptr<BatchStore>> open(Options opt);
  ~BatchStore();
  BatchStore(const BatchStore&) = delete;
  BatchStore& operator=(const BatchStore&) = delete;

  // Writes the bytes under files/ (temporary name, fsync when durable, rename)
  // and inserts the record; returns it.
  Expected<FileRecord> add_file(const std::string& owner, const std::string& filename, const std::string& purpose,
                                std::string_view content);
  // Inserts a record whose bytes are already at f.path (a fixed id keeps a
  // repeated finalization idempotent).
  Expected<FileRecord> add_file_record(const FileRecord& f);
  // A record for a file that stays where it is (offline input).
  Expected<FileRecord> add_file_ref(const std::string& owner, const std::string& path, int64_t bytes);
  std::optional<FileRecord> file(const std::string& owner, const std::string& id) const;
  // Newest first (order "desc") or oldest first ("asc"); purpose filter when non-empty.
  std::vector<FileRecord> list_files(const std::string& owner, const std::string& purpose, const ListPage& page,
                                     bool ascending, bool* has_more) const;
  // Removes the record and the bytes (inside the files folder only).
  Status delete_file(const std::string& owner, const std::string& id);

  Expected<BatchRecord> add_batch(BatchRecord b);  // fills id (when empty) and created_at (when 0)
  // owner empty: any owner (the runner).
  std::optional<BatchRecord> batch(const std::string& owner, const std::string& id) const;
  std::vector<BatchRecord> list_batches(const std::string& owner, const ListPage& page, bool* has_more) const;
  // Batches in one of these states, oldest first.
  std::vector<BatchRecord> batches_in(const std::vector<std::string>& statuses) const;
  // Unfinished batches reading this file.
  std::vector<std::string> batches_using(const std::string& file_id) const;
  // Replaces the row's mutable fields (status, timestamps, counts, errors,
  // output ids) only if its status is still `expected` (a concurrent cancel
  // is never overwritten). Returns false when it was not.
  Expected<bool> update_batch(const BatchRecord& b, const std::string& expected);
  // Moves a batch from `from` to `to` only if it is in `from` (compare-and-set);
  // sets the timestamp field of `to`. Returns false when it was not in `from`.
  Expected<bool> transition(const std::string& id, const std::string& from, const std::string& to, int64_t now);

  // One transaction; rows already there are kept (INSERT OR IGNORE).
  Status commit_lines(const std::string& batch_id, const std::vector<LineOutcome>& lines);
  std::vector<int64_t> done_lines(const std::string& batch_id) const;  // ascending
  RequestCounts counts(const std::string& batch_id, int64_t total) const;
  int64_t completion_tokens(const std::string& batch_id) const;
  // Writes the ok (or failed) lines' records in line order to `path`
  // (temporary name, fsync when durable, rename); returns the byte count.
  Expected<int64_t> write_results(const std::string& batch_id, bool ok, const std::string& path) const;

  // A fresh path inside the files folder for a new file id.
  std::string path_for(const std::string& file_id) const;
  const std::string& dir() const { return opt_.dir; }
  bool durable() const { return opt_.durable_fsync; }

 private:
  explicit BatchStore(Options opt) : opt_(std::move(opt)) {}
  Status exec(const char* sql) const;
  Expected<FileRecord> insert_file(const FileRecord& f);

  Options opt_;
  mutable std::mutex mu_;
  sqlite3* db_ = nullptr;
  int lock_fd_ = -1;  // flock'ed: one process per store
};

// "file-" / "batch_" / "batch_req_" + 24 random hex digits.
std::string new_object_id(const char* prefix);
int64_t unix_seconds();
uint64_t fnv1a64(std::string_view bytes, uint64_t h = 0xcbf29ce484222325ull);
// Writes bytes to path through path + ".tmp" and a rename (fsync when asked).
Status write_file_atomic(const std::string& path, std::string_view bytes, bool fsync_it);

}  // namespace serval::server
