#include "server/batch_runner.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <unistd.h>
#include <nlohmann/json.hpp>
#include <set>

#include "server/openai_request.h"

namespace serval::server {

using json = nlohmann::ordered_json;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

constexpr int kMaxLineDepth = 64;

json error_record(int64_t line, const std::string& custom_id, const std::string& code, const std::string& message) {
  return json{{"id", new_object_id("batch_req_")},
              {"custom_id", custom_id.empty() ? json(nullptr) : json(custom_id)},
              {"response", nullptr},
              {"error", {{"code", code}, {"message", "line " + std::to_string(line) + ": " + message}, {"line", line}}}};
}

bool read_whole(const std::string& path, size_t max_bytes, std::string* out, std::string* err) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *err = "cannot read the input file";
    return false;
  }
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || (uint64_t)size > max_bytes) {
    *err = "the input file is larger than " + std::to_string(max_bytes) + " bytes";
    return false;
  }
  in.seekg(0);
  out->resize((size_t)size);
  in.read(out->data(), size);
  if (!in) {
    *err = "cannot read the input file";
    return false;
  }
  return true;
}

}  // namespace

bool batch_endpoint_supported(const std::string& url) {
  return url == "/v1/chat/completions" || url == "/v1/completions";
}

ValidatedInput validate_batch_input(std::string_view content, const std::string& endpoint, const BatchLimits& limits) {
  ValidatedInput v;
  if (content.size() > limits.max_file_bytes) {
    v.fatal = "the input file is larger than " + std::to_string(limits.max_file_bytes) + " bytes";
    return v;
  }
  std::set<std::string> seen;
  size_t pos = 0;
  int64_t line_no = 0;
  while (pos < content.size()) {
    size_t end = content.find('\n', pos);
    if (end == std::string_view::npos) end = content.size();
    std::string_view text = content.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    if (text.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank
    if (++v.total > (int64_t)limits.max_lines) {
      v.fatal = "the input file has more than " + std::to_string(limits.max_lines) + " lines";
      v.lines.clear();
      v.malformed.clear();
      return v;
    }
    auto bad = [&](const std::string& cid, const std::string& code, const std::string& msg) {
      LineOutcome o;
      o.line = line_no;
      o.custom_id = cid;
      o.ok = false;
      o.record = dump(error_record(line_no, cid, code, msg));
      v.malformed.push_back(std::move(o));
    };
    if (text.size() > limits.max_line_bytes) {
      bad("", "line_too_long", "longer than " + std::to_string(limits.max_line_bytes) + " bytes");
      continue;
    }
    if (json_depth(text) > kMaxLineDepth) {
      bad("", "invalid_json_line", "nests deeper than " + std::to_string(kMaxLineDepth));
      continue;
    }
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception&) {
      bad("", "invalid_json_line", "not valid JSON");
      continue;
    }
    if (!j.is_object()) {
      bad("", "invalid_json_line", "expected a JSON object");
      continue;
    }
    std::string cid;
    if (j.contains("custom_id") && j["custom_id"].is_string()) cid = j["custom_id"].get<std::string>();
    if (cid.empty() || cid.size() > limits.max_custom_id) {
      bad("", "invalid_request", "custom_id: expected a non-empty string of at most " +
                                     std::to_string(limits.max_custom_id) + " characters");
      continue;
    }
    if (!seen.insert(cid).second) {
      bad(cid, "duplicate_custom_id", "custom_id '" + cid + "' appears on an earlier line");
      continue;
    }
    if (!j.contains("method") || !j["method"].is_string() || j["method"].get<std::string>() != "POST") {
      bad(cid, "invalid_request", "method: expected \"POST\"");
      continue;
    }
    if (!j.contains("url") || !j["url"].is_string()) {
      bad(cid, "invalid_request", "url: expected a string");
      continue;
    }
    const std::string url = j["url"].get<std::string>();
    if (endpoint == "*" ? !batch_endpoint_supported(url) : url != endpoint) {
      bad(cid, "invalid_url",
          "url: expected " + (endpoint == "*" ? std::string("/v1/chat/completions or /v1/completions")
                                              : "the batch's endpoint " + endpoint) +
              ", got " + url.substr(0, 200));
      continue;
    }
    if (!j.contains("body") || !j["body"].is_object()) {
      bad(cid, "invalid_request", "body: expected a JSON object");
      continue;
    }
    v.lines.push_back(BatchLine{line_no, cid, url, dump(j["body"])});
  }
  if (v.total == 0) v.fatal = "the input file has no lines";
  return v;
}

BatchRunner::BatchRunner(BatchStore& store, LineExecutor exec, BatchRunnerConfig cfg)
    : store_(store), exec_(std::move(exec)), cfg_(std::move(cfg)) {}

BatchRunner::~BatchRunner() { stop(); }

void BatchRunner::start() {
  std::lock_guard<std::mutex> tl(th_mu_);
  if (th_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(inbox_->mu);
    inbox_->stop = false;
  }
  th_ = std::thread([this] { loop(); });
}

void BatchRunner::stop() {
  std::lock_guard<std::mutex> tl(th_mu_);
  if (!th_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(inbox_->mu);
    inbox_->stop = true;
  }
  inbox_->cv.notify_all();
  th_.join();
}

void BatchRunner::wake() {
  {
    std::lock_guard<std::mutex> lk(inbox_->mu);
    inbox_->wake = true;
  }
  inbox_->cv.notify_all();
}

void BatchRunner::set_progress(std::function<void(const BatchProgress&)> fn) {
  std::lock_guard<std::mutex> lk(inbox_->mu);
  inbox_->progress = std::move(fn);
}

int64_t BatchRunner::in_flight() const { return n_inflight_.load(); }

double BatchRunner::now_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void BatchRunner::loop() {
  double next_poll = 0;
  for (;;) {
    std::vector<Reply> replies;
    bool stopping = false;
    {
      Inbox& in = *inbox_;
      std::unique_lock<std::mutex> lk(in.mu);
      const double wait = std::max(0.0, next_poll - now_s());
      in.cv.wait_for(lk, std::chrono::duration<double>(std::min(wait, cfg_.poll_s)),
                     [&] { return in.stop || in.wake || !in.replies.empty(); });
      replies.swap(in.replies);
      stopping = in.stop;
      if (in.wake) next_poll = 0;
      in.wake = false;
    }
    commit_replies(std::move(replies));
    if (stopping) break;
    if (now_s() >= next_poll) {
      poll_store();
      next_poll = now_s() + cfg_.poll_s;
    }
    finish_if_done();
    dispatch();
  }
  // Replies that arrived are committed; lines still in flight are cancelled
  // (uncommitted, they run again after a restart).
  std::vector<Reply> last;
  {
    std::lock_guard<std::mutex> lk(inbox_->mu);
    last.swap(inbox_->replies);
  }
  commit_replies(std::move(last));
  for (auto& [id, a] : active_) cancel_inflight(a);
  active_.clear();
}

void BatchRunner::poll_store() {
  for (BatchRecord& b : store_.batches_in({"validating"})) validate(std::move(b));
  const int64_t now = unix_seconds();
  for (const BatchRecord& b : store_.batches_in({"in_progress", "cancelling", "finalizing"})) {
    if (b.status == "finalizing") {
      finalize(b, "completed");
      continue;
    }
    auto it = active_.find(b.id);
    if (it == active_.end() && b.status == "cancelling") {  // nothing of it runs in this process
      finalize(b, "cancelled");
      continue;
    }
    if (it == active_.end()) {
      load(b);
      it = active_.find(b.id);
      if (it == active_.end()) continue;
    }
    Active& a = it->second;
    if (a.rec.status != "expiring") a.rec.status = b.status;
    if (b.status == "in_progress" && b.expires_at > 0 && now >= b.expires_at) {
      auto moved = store_.transition(b.id, "in_progress", "cancelling", now);
      (void)moved;
      a.rec.status = "expiring";
    }
    if (a.rec.status != "in_progress") {
      cancel_inflight(a);
      a.pending.clear();
      a.retry.clear();
    }
  }
}

void BatchRunner::validate(BatchRecord b) {
  std::optional<FileRecord> f = store_.file(b.owner, b.input_file_id);
  std::string content, err;
  ValidatedInput v;
  if (!f) {
    v.fatal = "input_file_id: the file '" + b.input_file_id + "' no longer exists";
  } else if (!read_whole(f->path, cfg_.limits.max_file_bytes, &content, &err)) {
    v.fatal = err;
  } else {
    v = validate_batch_input(content, b.endpoint, cfg_.limits);
  }
  const int64_t now = unix_seconds();
  if (!v.fatal.empty()) {
    b.errors_json = dump(json{{"object", "list"},
                              {"data", json::array({{{"code", "invalid_file"}, {"message", v.fatal}, {"line", nullptr}}})}});
    b.status = "failed";
    b.failed_at = now;
    b.total = v.total;
    (void)store_.update_batch(b, "validating");  // unless cancelled meanwhile
    report(b);
    return;
  }
  if (!store_.commit_lines(b.id, v.malformed).ok()) return;  // tried again at the next poll
  b.total = v.total;
  b.input_hash = fnv1a64(content);
  b.status = "in_progress";
  b.in_progress_at = now;
  (void)store_.update_batch(b, "validating");  // a cancel meanwhile wins; the next poll finalizes it
  report(b);
}

void BatchRunner::load(const BatchRecord& b) {
  std::optional<FileRecord> f = store_.file(b.owner, b.input_file_id);
  std::string content, err;
  if (!f || !read_whole(f->path, cfg_.limits.max_file_bytes, &content, &err) || fnv1a64(content) != b.input_hash) {
    // The input vanished or changed under a running batch: nothing more can run.
    BatchRecord failed = b;
    failed.status = "failed";
    failed.failed_at = unix_seconds();
    failed.errors_json = dump(json{
        {"object", "list"},
        {"data", json::array({{{"code", "invalid_file"},
                               {"message", "the input file was removed or changed while the batch ran"},
                               {"line", nullptr}}})}});
    (void)store_.update_batch(failed, b.status);
    report(failed);
    return;
  }
  ValidatedInput v = validate_batch_input(content, b.endpoint, cfg_.limits);
  const std::vector<int64_t> done = store_.done_lines(b.id);
  Active a;
  a.rec = b;
  a.progress.batch_id = b.id;
  a.progress.status = b.status;
  a.progress.counts = store_.counts(b.id, b.total);
  a.progress.completion_tokens = store_.completion_tokens(b.id);
  for (BatchLine& l : v.lines)
    if (!std::binary_search(done.begin(), done.end(), l.line)) a.pending.push_back(std::move(l));
  active_.emplace(b.id, std::move(a));
}

void BatchRunner::cancel_inflight(Active& a) {
  for (auto& [line, cancel] : a.inflight) {
    if (cancel) cancel();
    n_inflight_--;
  }
  a.inflight.clear();
  a.inflight_lines.clear();
}

void BatchRunner::dispatch() {
  const double now = now_s();
  for (auto& [id, a] : active_) {
    // Retries whose delay passed go back to the front, in line order.
    std::sort(a.retry.begin(), a.retry.end(), [](const auto& x, const auto& y) { return x.second.line > y.second.line; });
    for (size_t i = a.retry.size(); i-- > 0;)
      if (a.retry[i].first <= now) {
        a.pending.push_front(std::move(a.retry[i].second));
        a.retry.erase(a.retry.begin() + (ptrdiff_t)i);
      }
  }
  // Oldest batch first (active_ is keyed by id; order by creation time).
  std::vector<Active*> order;
  for (auto& [id, a] : active_)
    if (a.rec.status == "in_progress") order.push_back(&a);
  std::sort(order.begin(), order.end(), [](const Active* x, const Active* y) {
    return x->rec.created_at != y->rec.created_at ? x->rec.created_at < y->rec.created_at : x->rec.id < y->rec.id;
  });
  for (Active* a : order) {
    while (n_inflight_.load() < cfg_.concurrency && !a->pending.empty()) {
      BatchLine l = std::move(a->pending.front());
      a->pending.pop_front();
      const int64_t line = l.line;
      const std::string batch_id = a->rec.id;
      n_inflight_++;
      a->inflight[line] = nullptr;
      LineCall call{l.url, l.body, a->rec.owner};
      a->inflight_lines.emplace(line, std::move(l));
      auto cancel = exec_(call, [inbox = inbox_, batch_id, line](LineReply r) {
        {
          std::lock_guard<std::mutex> lk(inbox->mu);
          inbox->replies.push_back(Reply{batch_id, line, std::move(r)});
        }
        inbox->cv.notify_all();
      });
      auto it = a->inflight.find(line);
      if (it != a->inflight.end()) it->second = std::move(cancel);
    }
  }
}

void BatchRunner::commit_replies(std::vector<Reply> replies) {
  if (replies.empty()) return;
  std::map<std::string, std::vector<LineOutcome>> by_batch;
  const double now = now_s();
  for (Reply& r : replies) {
    auto it = active_.find(r.batch_id);
    if (it == active_.end()) continue;
    Active& a = it->second;
    auto inf = a.inflight.find(r.line);
    if (inf == a.inflight.end()) continue;  // cancelled: its reply does not count
    a.inflight.erase(inf);
    n_inflight_--;
    auto ln = a.inflight_lines.find(r.line);
    BatchLine line = std::move(ln->second);
    a.inflight_lines.erase(ln);
    const int s = r.reply.status;
    if (s == 0 || s == 429 || s == 503) {  // could not run now: again later
      if (a.rec.status == "in_progress") a.retry.emplace_back(now + cfg_.retry_delay_s, std::move(line));
      continue;
    }
    json body;
    try {
      body = json::parse(r.reply.body);
    } catch (const json::exception&) {
      body = r.reply.body;  // not JSON: kept as a string
    }
    LineOutcome o;
    o.line = line.line;
    o.custom_id = line.custom_id;
    o.ok = s >= 200 && s < 300;
    const std::string req_id = body.is_object() && body.contains("id") && body["id"].is_string()
                                   ? body["id"].get<std::string>()
                                   : new_object_id("req_");
    json rec = {{"id", new_object_id("batch_req_")},
                {"custom_id", line.custom_id},
                {"response", {{"status_code", s}, {"request_id", req_id}, {"body", body}}},
                {"error", nullptr}};
    if (!o.ok) {
      std::string code = "request_failed", message = "status " + std::to_string(s);
      if (body.is_object() && body.contains("error") && body["error"].is_object()) {
        const json& e = body["error"];
        if (e.contains("code") && e["code"].is_string() && !e["code"].get<std::string>().empty())
          code = e["code"].get<std::string>();
        if (e.contains("message") && e["message"].is_string()) message = e["message"].get<std::string>();
      }
      rec["error"] = {{"code", code}, {"message", message}};
    }
    if (o.ok && body.is_object() && body.contains("usage") && body["usage"].is_object() &&
        body["usage"].contains("completion_tokens") && body["usage"]["completion_tokens"].is_number_integer())
      o.completion_tokens = body["usage"]["completion_tokens"].get<int64_t>();
    o.record = dump(rec);
    by_batch[r.batch_id].push_back(std::move(o));
  }
  for (auto& [id, outcomes] : by_batch) {
    Status st = store_.commit_lines(id, outcomes);
    Active& a = active_.at(id);
    if (!st.ok()) {
      // Not committed, so not done: the batch is loaded again from its committed rows.
      cancel_inflight(a);
      active_.erase(id);
      continue;
    }
    for (const LineOutcome& o : outcomes) {  // rows of lines that were pending: each one new
      (o.ok ? a.progress.counts.completed : a.progress.counts.failed)++;
      a.progress.completion_tokens += o.completion_tokens;
    }
    a.progress.in_flight = (int64_t)a.inflight.size();
    report(a.progress);
  }
}

void BatchRunner::finish_if_done() {
  std::vector<std::string> ended;
  for (auto& [id, a] : active_) {
    if (!a.inflight.empty()) continue;
    if (a.rec.status == "in_progress" && a.pending.empty() && a.retry.empty()) {
      auto moved = store_.transition(id, "in_progress", "finalizing", unix_seconds());
      if (moved.ok() && *moved) {
        if (auto b = store_.batch("", id)) finalize(*b, "completed");
      }
      ended.push_back(id);
    } else if (a.rec.status == "cancelling" || a.rec.status == "expiring") {
      if (auto b = store_.batch("", id)) finalize(*b, a.rec.status == "expiring" ? "expired" : "cancelled");
      ended.push_back(id);
    }
  }
  for (const std::string& id : ended) active_.erase(id);
}

void BatchRunner::finalize(const BatchRecord& rec, const std::string& final_status) {
  BatchRecord b = rec;
  const RequestCounts c = store_.counts(b.id, b.total);
  const std::string suffix = b.id.substr(b.id.find('_') + 1);
  auto write = [&](bool ok, const std::string& offline_path, std::string* file_id) -> bool {
    if (!b.output_path.empty() || !b.error_path.empty()) {  // offline: the user's paths
      if (offline_path.empty()) return true;
      if ((ok ? c.completed : c.failed) == 0 && !ok) {  // no error file when nothing failed (a stale one goes)
        ::unlink(offline_path.c_str());
        return true;
      }
      return store_.write_results(b.id, ok, offline_path).ok();
    }
    if ((ok ? c.completed : c.failed) == 0) return true;  // OpenAI: no file for nothing
    const std::string id = "file-" + suffix + (ok ? "-output" : "-errors");
    if (!store_.file(b.owner, id)) {
      FileRecord f;
      f.id = id;
      f.owner = b.owner;
      f.filename = b.id + (ok ? "_output.jsonl" : "_errors.jsonl");
      f.purpose = "batch_output";
      f.created_at = unix_seconds();
      f.path = store_.path_for(id);
      auto n = store_.write_results(b.id, ok, f.path);
      if (!n.ok()) return false;
      f.bytes = *n;
      if (!store_.add_file_record(f).ok()) return false;
    }
    *file_id = id;
    return true;
  };
  std::string out_id, err_id;
  if (!write(true, b.output_path, &out_id) || !write(false, b.error_path, &err_id)) return;  // next poll retries
  b.output_file_id = out_id;
  b.error_file_id = err_id;
  const int64_t now = unix_seconds();
  if (b.finalizing_at == 0) b.finalizing_at = now;
  b.status = final_status;
  if (final_status == "completed") b.completed_at = now;
  if (final_status == "cancelled") b.cancelled_at = now;
  if (final_status == "expired") b.expired_at = now;
  (void)store_.update_batch(b, rec.status);
  report(b);
}

void BatchRunner::report(const BatchRecord& b) {
  {
    std::lock_guard<std::mutex> lk(inbox_->mu);
    if (!inbox_->progress) return;
  }
  BatchProgress p;
  p.batch_id = b.id;
  p.status = b.status;
  p.counts = store_.counts(b.id, b.total);
  p.completion_tokens = store_.completion_tokens(b.id);
  report(p);
}

void BatchRunner::report(const BatchProgress& p) {
  std::function<void(const BatchProgress&)> fn;
  {
    std::lock_guard<std::mutex> lk(inbox_->mu);
    fn = inbox_->progress;
  }
  if (fn) fn(p);
}

std::string BatchRunner::batch_json(const BatchRecord& b) const {
  auto ts = [](int64_t t) { return t ? json(t) : json(nullptr); };
  auto id_or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  json meta = nullptr;
  try {
    meta = json::parse(b.metadata_json);
  } catch (const json::exception&) {
  }
  json errors = nullptr;
  try {
    errors = json::parse(b.errors_json);
  } catch (const json::exception&) {
  }
  const RequestCounts c = store_.counts(b.id, b.total);
  json j = {{"id", b.id},
            {"object", "batch"},
            {"endpoint", b.endpoint},
            {"errors", errors},
            {"input_file_id", b.input_file_id},
            {"completion_window", b.completion_window},
            {"status", b.status},
            {"output_file_id", id_or_null(b.output_file_id)},
            {"error_file_id", id_or_null(b.error_file_id)},
            {"created_at", b.created_at},
            {"in_progress_at", ts(b.in_progress_at)},
            {"expires_at", ts(b.expires_at)},
            {"finalizing_at", ts(b.finalizing_at)},
            {"completed_at", ts(b.completed_at)},
            {"failed_at", ts(b.failed_at)},
            {"expired_at", ts(b.expired_at)},
            {"cancelling_at", ts(b.cancelling_at)},
            {"cancelled_at", ts(b.cancelled_at)},
            {"request_counts", {{"total", c.total}, {"completed", c.completed}, {"failed", c.failed}}},
            {"metadata", meta}};
  return dump(j);
}

}  // namespace serval::server
