// The batch store, runner and multipart parser without a model: a fake
// executor answers lines, so the exactly-once, retry, cancel, resume and
// concurrency rules are checked exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "server/batch_runner.h"
#include "server/batch_store.h"
#include "server/multipart.h"

namespace serval::server {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct TempDir {
  fs::path path;
  TempDir() {
    char tmpl[] = "/tmp/serval-batch-test-XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string lines_file(int n, const std::string& url = "/v1/completions") {
  std::string s;
  for (int i = 0; i < n; ++i)
    s += json{{"custom_id", "r" + std::to_string(i)}, {"method", "POST"}, {"url", url}, {"body", {{"prompt", i}}}}.dump() + "\n";
  return s;
}

bool wait_for(const std::function<bool()>& f, double seconds = 10) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return f();
}

std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

// Answers each line on its own thread after `delay_ms`, echoing the prompt;
// counts calls and the most in flight at once. `reply_status` can be changed.
struct FakeExecutor {
  std::atomic<int> calls{0}, in_flight{0}, max_in_flight{0}, cancels{0};
  std::atomic<int> reply_status{200};
  int delay_ms = 2;
  std::mutex mu;
  std::vector<std::thread> threads;
  std::map<std::string, int> runs_per_prompt;  // how often each body ran to completion

  ~FakeExecutor() { join(); }
  void join() {
    std::lock_guard<std::mutex> lk(mu);
    for (auto& t : threads) t.join();
    threads.clear();
  }
  LineExecutor fn() {
    return [this](const LineCall& c, std::function<void(LineReply)> done) {
      calls++;
      const int now = ++in_flight;
      int m = max_in_flight.load();
      while (now > m && !max_in_flight.compare_exchange_weak(m, now)) {
      }
      auto cancelled = std::make_shared<std::atomic<bool>>(false);
      std::lock_guard<std::mutex> lk(mu);
      threads.emplace_back([this, c, done, cancelled] {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        const int st = reply_status.load();
        in_flight--;
        if (!*cancelled && st == 200) {
          std::lock_guard<std::mutex> lk2(mu);
          runs_per_prompt[c.body]++;
        }
        json body = st == 200 ? json{{"id", "cmpl-x"}, {"echo", json::parse(c.body)}, {"usage", {{"completion_tokens", 3}}}}
                              : json{{"error", {{"message", "nope"}, {"code", "test_error"}}}};
        done(LineReply{st, body.dump()});
      });
      return [this, cancelled] {
        *cancelled = true;
        cancels++;
      };
    };
  }
};

Expected<std::unique_ptr<BatchStore>> open_store(const TempDir& d) {
  BatchStore::Options o;
  o.dir = d.path.string();
  return BatchStore::open(o);
}

BatchRecord make_batch(BatchStore& store, const std::string& owner, const std::string& content,
                       const std::string& endpoint = "/v1/completions") {
  auto f = store.add_file(owner, "in.jsonl", "batch", content);
  EXPECT_TRUE(f.ok()) << f.status().message();
  BatchRecord b;
  b.owner = owner;
  b.endpoint = endpoint;
  b.input_file_id = f->id;
  b.expires_at = unix_seconds() + 3600;
  auto added = store.add_batch(b);
  EXPECT_TRUE(added.ok());
  return *added;
}

BatchRunnerConfig fast_config(int concurrency) {
  BatchRunnerConfig c;
  c.concurrency = concurrency;
  c.poll_s = 0.01;
  c.retry_delay_s = 0.01;
  return c;
}

TEST(Multipart, ParsesFieldsAndFile) {
  const std::string ct = "multipart/form-data; boundary=\"xyz123\"";
  ASSERT_EQ(multipart_boundary(ct), "xyz123");
  const std::string body =
      "--xyz123\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
      "--xyz123\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a b.jsonl\"\r\n"
      "Content-Type: application/jsonl\r\n\r\nline1\r\nline2\n\r\n--xyz123--\r\n";
  auto parts = parse_multipart(body, "xyz123");
  ASSERT_TRUE(parts.ok()) << parts.status().message();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "purpose");
  EXPECT_EQ((*parts)[0].data, "batch");
  EXPECT_EQ((*parts)[1].name, "file");
  EXPECT_EQ((*parts)[1].filename, "a b.jsonl");
  EXPECT_EQ((*parts)[1].content_type, "application/jsonl");
  EXPECT_EQ((*parts)[1].data, "line1\r\nline2\n");  // bytes kept exactly, CRLFs inside included
}

TEST(Multipart, RefusesMalformedBodies) {
  EXPECT_EQ(multipart_boundary("application/json"), "");
  EXPECT_EQ(multipart_boundary("multipart/form-data"), "");
  EXPECT_EQ(multipart_boundary("multipart/form-data; boundary=" + std::string(71, 'a')), "");
  EXPECT_FALSE(parse_multipart("no boundary here", "b").ok());
  EXPECT_FALSE(parse_multipart("--b\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\ndata without end", "b").ok());
  EXPECT_FALSE(parse_multipart("--b\r\nX-Other: 1\r\n\r\ndata\r\n--b--", "b").ok());  // no name
  std::string many;
  for (int i = 0; i < 20; ++i) many += "--b\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nx\r\n";
  many += "--b--";
  auto r = parse_multipart(many, "b", MultipartLimits{16, 8192});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("more than 16 parts"), std::string::npos);
}

TEST(BatchInput, ValidLinesAndMalformedOnesWithLineNumbers) {
  std::string in = lines_file(3);
  in += "\n";  // blank: skipped, still a line number
  in += "{not json\n";
  in += json{{"custom_id", "r1"}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", json::object()}}.dump() + "\n";
  in += json{{"custom_id", "g"}, {"method", "GET"}, {"url", "/v1/completions"}, {"body", json::object()}}.dump() + "\n";
  in += json{{"custom_id", "u"}, {"method", "POST"}, {"url", "/v1/chat/completions"}, {"body", json::object()}}.dump() + "\n";
  in += json{{"custom_id", "b"}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", "x"}}.dump() + "\n";
  in += json{{"method", "POST"}, {"url", "/v1/completions"}, {"body", json::object()}}.dump();  // no newline at the end
  ValidatedInput v = validate_batch_input(in, "/v1/completions", BatchLimits{});
  EXPECT_TRUE(v.fatal.empty());
  EXPECT_EQ(v.total, 9);
  ASSERT_EQ(v.lines.size(), 3u);
  EXPECT_EQ(v.lines[2].line, 3);
  EXPECT_EQ(v.lines[2].custom_id, "r2");
  EXPECT_EQ(json::parse(v.lines[2].body), (json{{"prompt", 2}}));
  ASSERT_EQ(v.malformed.size(), 6u);
  const std::vector<std::pair<int64_t, std::string>> want = {{5, "invalid_json_line"}, {6, "duplicate_custom_id"},
                                                             {7, "invalid_request"},   {8, "invalid_url"},
                                                             {9, "invalid_request"},   {10, "invalid_request"}};
  for (size_t i = 0; i < want.size(); ++i) {
    const json rec = json::parse(v.malformed[i].record);
    EXPECT_EQ(v.malformed[i].line, want[i].first);
    EXPECT_EQ(rec["error"]["code"], want[i].second) << rec.dump();
    EXPECT_EQ(rec["error"]["line"], want[i].first);
    EXPECT_TRUE(rec["response"].is_null());
  }
  // "*" (offline) accepts either endpoint per line.
  EXPECT_EQ(validate_batch_input(lines_file(2, "/v1/chat/completions"), "*", BatchLimits{}).lines.size(), 2u);
}

TEST(BatchInput, FileBoundsAreFatal) {
  BatchLimits small;
  small.max_lines = 5;
  EXPECT_NE(validate_batch_input(lines_file(6), "/v1/completions", small).fatal.find("more than 5 lines"),
            std::string::npos);
  EXPECT_TRUE(validate_batch_input(lines_file(5), "/v1/completions", small).fatal.empty());
  EXPECT_FALSE(validate_batch_input("\n \n", "/v1/completions", small).fatal.empty());  // no lines
  small.max_file_bytes = 10;
  EXPECT_FALSE(validate_batch_input(lines_file(1), "/v1/completions", small).fatal.empty());
  BatchLimits line_cap;
  line_cap.max_line_bytes = 20;
  ValidatedInput v = validate_batch_input(lines_file(1), "/v1/completions", line_cap);
  ASSERT_EQ(v.malformed.size(), 1u);
  EXPECT_EQ(json::parse(v.malformed[0].record)["error"]["code"], "line_too_long");
}

TEST(BatchStore, LineOutcomesAreCommittedOnce) {
  TempDir d;
  auto s = open_store(d);
  ASSERT_TRUE(s.ok()) << s.status().message();
  LineOutcome a{2, "a", true, R"({"n":1})", 5}, b{1, "b", false, R"({"n":2})", 0};
  ASSERT_TRUE((*s)->commit_lines("batch_1", {a, b}).ok());
  LineOutcome a2 = a;
  a2.record = R"({"n":"again"})";
  ASSERT_TRUE((*s)->commit_lines("batch_1", {a2}).ok());  // the first commit wins
  EXPECT_EQ((*s)->done_lines("batch_1"), (std::vector<int64_t>{1, 2}));
  const RequestCounts c = (*s)->counts("batch_1", 3);
  EXPECT_EQ(c.completed, 1);
  EXPECT_EQ(c.failed, 1);
  EXPECT_EQ((*s)->completion_tokens("batch_1"), 5);
  const std::string out = (d.path / "out.jsonl").string();
  ASSERT_TRUE((*s)->write_results("batch_1", true, out).ok());
  ASSERT_EQ(read_jsonl(out), (std::vector<json>{json{{"n", 1}}}));
  // A second process cannot open the same store.
  auto second = open_store(d);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("in use"), std::string::npos);
}

TEST(BatchStore, OwnersSeeOnlyTheirOwnFilesAndBatches) {
  TempDir d;
  auto s = open_store(d);
  ASSERT_TRUE(s.ok());
  auto f = (*s)->add_file("alice", "a.jsonl", "batch", "x");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE((*s)->file("alice", f->id));
  EXPECT_FALSE((*s)->file("bob", f->id));
  EXPECT_FALSE((*s)->delete_file("bob", f->id).ok());
  bool more = false;
  EXPECT_TRUE((*s)->list_files("bob", "", ListPage{}, false, &more).empty());
  BatchRecord b = make_batch(**s, "alice", "y");
  EXPECT_TRUE((*s)->batch("alice", b.id));
  EXPECT_FALSE((*s)->batch("bob", b.id));
  EXPECT_TRUE((*s)->list_batches("bob", ListPage{}, &more).empty());
  // Pagination: newest first, `after` continues.
  for (int i = 0; i < 4; ++i) make_batch(**s, "carol", "z");
  ListPage p;
  p.limit = 3;
  auto page1 = (*s)->list_batches("carol", p, &more);
  ASSERT_EQ(page1.size(), 3u);
  EXPECT_TRUE(more);
  p.after = page1.back().id;
  auto page2 = (*s)->list_batches("carol", p, &more);
  ASSERT_EQ(page2.size(), 1u);
  EXPECT_FALSE(more);
  EXPECT_LT(page2[0].created_at + 0, page1[0].created_at + 1);
}

TEST(BatchRunner, RunsEveryLineOnceUnderTheConcurrencyCap) {
  TempDir d;
  auto s = open_store(d);
  ASSERT_TRUE(s.ok());
  std::string in = lines_file(40) + "garbage\n";
  BatchRecord b = make_batch(**s, "o", in);
  FakeExecutor ex;
  BatchRunner r(**s, ex.fn(), fast_config(3));
  r.start();
  ASSERT_TRUE(wait_for([&] { return (*s)->batch("o", b.id)->status == "completed"; }));
  r.stop();
  ex.join();
  const BatchRecord done = *(*s)->batch("o", b.id);
  EXPECT_EQ(done.total, 41);
  EXPECT_LE(ex.max_in_flight.load(), 3);
  EXPECT_EQ(ex.calls.load(), 40);
  const RequestCounts c = (*s)->counts(b.id, done.total);
  EXPECT_EQ(c.completed, 40);
  EXPECT_EQ(c.failed, 1);
  auto out = (*s)->file("o", done.output_file_id);
  ASSERT_TRUE(out);
  EXPECT_EQ(out->purpose, "batch_output");
  std::vector<json> rows = read_jsonl(out->path);
  ASSERT_EQ(rows.size(), 40u);
  for (size_t i = 0; i < rows.size(); ++i) {  // in line order, each line's own body
    EXPECT_EQ(rows[i]["custom_id"], "r" + std::to_string(i));
    EXPECT_EQ(rows[i]["response"]["status_code"], 200);
    EXPECT_EQ(rows[i]["response"]["body"]["echo"]["prompt"], (int)i);
  }
  std::vector<json> errs = read_jsonl((*s)->file("o", done.error_file_id)->path);
  ASSERT_EQ(errs.size(), 1u);
  EXPECT_EQ(errs[0]["error"]["line"], 41);
}

TEST(BatchRunner, RetriesLinesThatCouldNotRunAndRecordsFailures) {
  TempDir d;
  auto s = open_store(d);
  ASSERT_TRUE(s.ok());
  BatchRecord b = make_batch(**s, "o", lines_file(6));
  FakeExecutor ex;
  ex.reply_status = 429;  // at capacity: nothing may be recorded yet
  BatchRunner r(**s, ex.fn(), fast_config(2));
  r.start();
  ASSERT_TRUE(wait_for([&] { return ex.calls.load() >= 12; }));
  EXPECT_TRUE((*s)->done_lines(b.id).empty());
  ex.reply_status = 500;  // a real failure: recorded in the error file
  ASSERT_TRUE(wait_for([&] { return (*s)->batch("o", b.id)->status == "completed"; }));
  r.stop();
  ex.join();
  const BatchRecord done = *(*s)->batch("o", b.id);
  EXPECT_EQ((*s)->counts(b.id, done.total).failed, 6);
  EXPECT_TRUE(done.output_file_id.empty());  // nothing succeeded: no output file, as OpenAI
  std::vector<json> errs = read_jsonl((*s)->file("o", done.error_file_id)->path);
  ASSERT_EQ(errs.size(), 6u);
  EXPECT_EQ(errs[0]["response"]["status_code"], 500);
  EXPECT_EQ(errs[0]["error"]["code"], "test_error");
}

TEST(BatchRunner, ResumesAfterAStopWithoutRepeatingCommittedLines) {
  TempDir d;
  std::map<std::string, int> runs;
  std::string batch_id;
  int first_committed = 0;
  {
    auto s = open_store(d);
    ASSERT_TRUE(s.ok());
    batch_id = make_batch(**s, "o", lines_file(60)).id;
    FakeExecutor ex;
    ex.delay_ms = 5;
    BatchRunner r(**s, ex.fn(), fast_config(4));
    r.start();
    ASSERT_TRUE(wait_for([&] { return (*s)->done_lines(batch_id).size() >= 20; }));
    r.stop();  // lines in flight are cancelled, not committed
    ex.join();
    first_committed = (int)(*s)->done_lines(batch_id).size();
    EXPECT_LT(first_committed, 60);
  }
  auto s = open_store(d);  // "restart": a new store and runner on the same folder
  ASSERT_TRUE(s.ok());
  FakeExecutor ex2;
  BatchRunner r2(**s, ex2.fn(), fast_config(4));
  r2.start();
  ASSERT_TRUE(wait_for([&] { return (*s)->batch("o", batch_id)->status == "completed"; }));
  r2.stop();
  ex2.join();
  // The second run made calls only for lines the first did not commit.
  EXPECT_EQ(ex2.calls.load(), 60 - first_committed);
  const BatchRecord done = *(*s)->batch("o", batch_id);
  std::vector<json> rows = read_jsonl((*s)->file("o", done.output_file_id)->path);
  ASSERT_EQ(rows.size(), 60u);
  std::set<std::string> ids;
  for (const json& row : rows) ids.insert(row["custom_id"].get<std::string>());
  EXPECT_EQ(ids.size(), 60u);
}

TEST(BatchRunner, CancelKeepsFinishedLinesAndStopsTheRest) {
  TempDir d;
  auto s = open_store(d);
  ASSERT_TRUE(s.ok());
  BatchRecord b = make_batch(**s, "o", lines_file(200));
  FakeExecutor ex;
  ex.delay_ms = 10;
  BatchRunner r(**s, ex.fn(), fast_config(2));
  r.start();
  ASSERT_TRUE(wait_for([&] { return (*s)->done_lines(b.id).size() >= 4; }));
  auto moved = (*s)->transition(b.id, "in_progress", "cancelling", unix_seconds());
  ASSERT_TRUE(moved.ok() && *moved);
  r.wake();
  ASSERT_TRUE(wait_for([&] { return (*s)->batch("o", b.id)->status == "cancelled"; }));
  r.stop();
  ex.join();
  const BatchRecord done = *(*s)->batch("o", b.id);
  const RequestCounts c = (*s)->counts(b.id, done.total);
  EXPECT_GE(c.completed, 4);
  EXPECT_LT(c.completed, 200);
  EXPECT_GT(done.cancelled_at, 0);
  EXPECT_EQ((int64_t)read_jsonl((*s)->file("o", done.output_file_id)->path).size(), c.completed);
}

TEST(BatchRunner, ExpiredWindowEndsTheBatch) {
  TempDir d;
  auto s = open_store(d);
  ASSERT_TRUE(s.ok());
  BatchRecord b = make_batch(**s, "o", lines_file(3));
  b.expires_at = unix_seconds() - 1;  // already past
  ASSERT_TRUE((*s)->update_batch(b, "validating").ok());
  FakeExecutor ex;
  ex.reply_status = 429;  // never runs: the window passes first
  BatchRunner r(**s, ex.fn(), fast_config(1));
  r.start();
  ASSERT_TRUE(wait_for([&] { return (*s)->batch("o", b.id)->status == "expired"; }));
  r.stop();
  ex.join();
  EXPECT_GT((*s)->batch("o", b.id)->expired_at, 0);
}

TEST(BatchRunner, AnUnreadableInputFailsTheBatch) {
  TempDir d;
  auto s = open_store(d);
  ASSERT_TRUE(s.ok());
  BatchRecord b = make_batch(**s, "o", "\n\n");
  FakeExecutor ex;
  BatchRunner r(**s, ex.fn(), fast_config(1));
  r.start();
  ASSERT_TRUE(wait_for([&] { return (*s)->batch("o", b.id)->status == "failed"; }));
  r.stop();
  const json errors = json::parse((*s)->batch("o", b.id)->errors_json);
  EXPECT_EQ(errors["data"][0]["code"], "invalid_file");
  EXPECT_EQ(ex.calls.load(), 0);
}

}  // namespace
}  // namespace serval::server
