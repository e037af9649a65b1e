// Runs batch jobs (OpenAI Batch API, `serval batch`): validates the input
// file, sends its lines through the API layer at the lowest priority with a
// cap on lines in flight, commits each line's outcome (batch_store.h) and
// builds the output and error files.
//
// Lifecycle of a batch: validating -> in_progress -> finalizing -> completed,
// or failed (the input is unusable as a whole), cancelling -> cancelled, or
// expired (its completion window passed); cancelled and expired batches keep
// the results of the lines that finished. On start, batches left in any
// unfinished state by a crash resume where their committed rows end.
//
// A line whose call could not run (429 at capacity, 503 while draining, or
// no answer) goes back to the queue and is retried after a delay; it never
// counts as done. Any other answer is committed: 2xx to the output file, the
// rest (and malformed lines) to the error file.
//
// Threads: one runner thread owns the in-memory queues and does every store
// write for lines; the executor's `done` callbacks may come from any thread
// and only queue the reply. Public methods are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/batch_store.h"

namespace serval::server {

struct BatchLimits {
  size_t max_file_bytes = 100u << 20;  // an input file (upload or offline)
  size_t max_lines = 50000;            // lines in one input file
  size_t max_line_bytes = 1u << 20;    // one line
  size_t max_custom_id = 512;          // characters of a custom_id
};

struct BatchRunnerConfig {
  int concurrency = 8;          // batch lines in flight, all batches together (--batch-concurrency)
  double retry_delay_s = 0.25;  // before a line that could not run is tried again
  double poll_s = 0.2;          // how often the store is checked for new, cancelled or expired batches
  BatchLimits limits;
};

// One line of an input file that passed validation.
struct BatchLine {
  int64_t line = 0;  // 1-based
  std::string custom_id;
  std::string url;
  std::string body;  // the JSON object of the request
};

struct ValidatedInput {
  std::vector<BatchLine> lines;           // valid lines in file order
  std::vector<LineOutcome> malformed;     // error-file records of the lines that are not
  int64_t total = 0;                      // non-blank lines
  std::string fatal;                      // non-empty: the file as a whole is unusable (too big, no lines)
};

// Parses and checks an input file: each non-blank line a JSON object with
// custom_id (a unique non-empty string), method "POST", url (== endpoint, or
// one of the supported endpoints when endpoint is "*") and body (an object).
ValidatedInput validate_batch_input(std::string_view content, const std::string& endpoint, const BatchLimits& limits);

bool batch_endpoint_supported(const std::string& url);

// The call the runner makes for one line; `done` is called exactly once, from
// any thread, with status 0 when the call could not be made at all.
struct LineCall {
  std::string url;
  std::string body;
  std::string owner;
};
struct LineReply {
  int status = 0;
  std::string body;
};
// Starts the call; returns a function that cancels it (the reply is then ignored).
using LineExecutor = std::function<std::function<void()>(const LineCall&, std::function<void(LineReply)>)>;

struct BatchProgress {
  std::string batch_id;
  std::string status;
  RequestCounts counts;
  int64_t completion_tokens = 0;
  int64_t in_flight = 0;
};

class BatchRunner {
 public:
  BatchRunner(BatchStore& store, LineExecutor exec, BatchRunnerConfig cfg);
  ~BatchRunner();
  BatchRunner(const BatchRunner&) = delete;
  BatchRunner& operator=(const BatchRunner&) = delete;

  void start();
  // Stops the thread: lines in flight are cancelled and not committed (they run
  // again after a restart); replies already received are committed first.
  void stop();
  // Something changed in the store (a new batch, a cancel): look now.
  void wake();
  // Called on the runner thread after each commit and state change.
  void set_progress(std::function<void(const BatchProgress&)> fn);
  int64_t in_flight() const;
  const BatchRunnerConfig& config() const { return cfg_; }

  // The object the API shows for a batch: status, timestamps, request_counts.
  std::string batch_json(const BatchRecord& b) const;

 private:
  struct Active {
    BatchRecord rec;
    std::deque<BatchLine> pending;
    std::map<int64_t, std::function<void()>> inflight;  // line -> canceller
    std::map<int64_t, BatchLine> inflight_lines;
    std::vector<std::pair<double, BatchLine>> retry;  // (not before, line)
    BatchProgress progress;  // counted here as lines commit (read from the store once, at load)
  };
  struct Reply {
    std::string batch_id;
    int64_t line = 0;
    LineReply reply;
  };

  void loop();
  void poll_store();
  void validate(BatchRecord b);
  void load(const BatchRecord& b);
  void dispatch();
  void commit_replies(std::vector<Reply> replies);
  void finish_if_done();
  void finalize(const BatchRecord& b, const std::string& final_status);
  void cancel_inflight(Active& a);
  // A state change: the counts are read from the store.
  void report(const BatchRecord& b);
  void report(const BatchProgress& p);
  double now_s() const;

  BatchStore& store_;
  LineExecutor exec_;
  BatchRunnerConfig cfg_;

  // Replies arrive here from any thread; shared with the executor's callbacks,
  // so a reply that comes after the runner is gone lands harmlessly.
  struct Inbox {
    std::mutex mu;  // guards everything below
    std::condition_variable cv;
    std::vector<Reply> replies;
    bool wake = false, stop = false;
    std::function<void(const BatchProgress&)> progress;
  };
  std::shared_ptr<Inbox> inbox_ = std::make_shared<Inbox>();
  std::mutex th_mu_;  // start/stop
  std::atomic<int64_t> n_inflight_{0};

  // Runner thread only.
  std::map<std::string, Active> active_;  // in_progress / cancelling batches being run
  std::thread th_;
};

}  // namespace serval::server
