// ModelRouter's loader with an injected model factory (no engine): a slow
// load must not hold back the deadlines of requests waiting for other models,
// and an operator's load route answers with the load's outcome however long
// the load takes.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "server/model_router.h"

using namespace serval;
using Clock = std::chrono::steady_clock;

namespace {

// Records the one response a request gets, and when.
class Recorder : public http::ResponseChannel {
 public:
  void send(int status, std::string, std::string body, http::Headers = {}) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (status_) return;
    status_ = status;
    body_ = std::move(body);
    at_ = Clock::now();
    cv_.notify_all();
  }
  void start_stream(int status, std::string, http::Headers = {}) override { send(status, "", ""); }
  void write(std::string) override {}
  void end() override {}
  void on_disconnect(std::function<void()>) override {}
  bool disconnected() const override { return false; }

  // Waits up to `limit` for the response; its status (0: none yet).
  int wait(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, limit, [&] { return status_ != 0; });
    return status_;
  }
  Clock::time_point at() {
    std::lock_guard<std::mutex> lk(mu_);
    return at_;
  }
  std::string body() {
    std::lock_guard<std::mutex> lk(mu_);
    return body_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int status_ = 0;
  std::string body_;
  Clock::time_point at_{};
};

http::HttpRequest completion_for(const std::string& model) {
  http::HttpRequest r;
  r.method = "POST";
  r.path = "/v1/completions";
  r.headers = {{"content-type", "application/json"}};
  r.body = nlohmann::json{{"model", model}, {"prompt", "hi"}, {"max_tokens", 1}}.dump();
  return r;
}

}  // namespace

TEST(ModelRouter, ASlowLoadDoesNotHoldBackOtherModelsDeadlines) {
  const std::string file = std::string(SERVAL_SHARED_DIR) + "/models/stories260K.gguf";
  std::vector<server::RouterModelSpec> specs(2);
  specs[0].name = "slow";
  specs[0].path = file;
  specs[1].name = "other";
  specs[1].path = file;
  // "slow" takes 2 s to fail its load; "other" fails at once (no engine here:
  // the test is about the waiting, not the serving).
  auto factory = [](const server::RouterModelSpec& s) -> Expected<std::unique_ptr<server::ServedModel>> {
    if (s.name == "slow") std::this_thread::sleep_for(std::chrono::seconds(2));
    return invalid_argument("test factory: no model");
  };
  server::RouterConfig cfg;
  cfg.load_wait_s = 0.3;
  cfg.models_max = 1;
  auto router = server::ModelRouter::create(specs, factory, cfg);
  ASSERT_TRUE(router.ok()) << router.status().message();

  auto slow = std::make_shared<Recorder>();
  (*router)->handle(completion_for("slow"), slow);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // the slow load is under way
  auto other = std::make_shared<Recorder>();
  const auto sent = Clock::now();
  (*router)->handle(completion_for("other"), other);

  ASSERT_EQ(other->wait(std::chrono::seconds(5)), 503) << other->body();
  const double waited = std::chrono::duration<double>(other->at() - sent).count();
  EXPECT_GE(waited, 0.25) << "answered before its deadline";
  EXPECT_LT(waited, 1.2) << "its deadline was checked only after the slow load";
  EXPECT_NE(other->body().find("model_loading"), std::string::npos) << other->body();

  // The slow model's own request: past its deadline too (503 while loading).
  ASSERT_EQ(slow->wait(std::chrono::seconds(5)), 503) << slow->body();
  EXPECT_NE(slow->body().find("model_loading"), std::string::npos) << slow->body();
}

TEST(ModelRouter, AFailedLoadAnswersItsWaitersWithTheLoadersMessage) {
  const std::string file = std::string(SERVAL_SHARED_DIR) + "/models/stories260K.gguf";
  std::vector<server::RouterModelSpec> specs(1);
  specs[0].name = "m";
  specs[0].path = file;
  auto factory = [](const server::RouterModelSpec&) -> Expected<std::unique_ptr<server::ServedModel>> {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return invalid_argument("bad tensor 'blk.0.attn_q.weight'");
  };
  server::RouterConfig cfg;
  cfg.load_wait_s = 10;
  auto router = server::ModelRouter::create(specs, factory, cfg);
  ASSERT_TRUE(router.ok()) << router.status().message();
  auto r = std::make_shared<Recorder>();
  (*router)->handle(completion_for("m"), r);
  ASSERT_EQ(r->wait(std::chrono::seconds(5)), 500) << r->body();
  EXPECT_NE(r->body().find("blk.0.attn_q.weight"), std::string::npos) << r->body();
  EXPECT_NE(r->body().find("model_load_failed"), std::string::npos) << r->body();
  const auto st = (*router)->status();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].state, server::ModelRouter::State::failed);
}

TEST(ModelRouter, TheAdminLoadRouteWaitsForALoadLongerThanTheRequestWait) {
  const std::string file = std::string(SERVAL_SHARED_DIR) + "/models/stories260K.gguf";
  std::vector<server::RouterModelSpec> specs(1);
  specs[0].name = "m";
  specs[0].path = file;
  // The load takes 1 s, past the 0.3 s a request waits; it fails (no engine
  // here), so the route's answer is the loader's message.
  auto factory = [](const server::RouterModelSpec&) -> Expected<std::unique_ptr<server::ServedModel>> {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    return invalid_argument("test factory: no model");
  };
  server::RouterConfig cfg;
  cfg.load_wait_s = 0.3;
  cfg.api_keys = {"k"};
  auto router = server::ModelRouter::create(specs, factory, cfg);
  ASSERT_TRUE(router.ok()) << router.status().message();
  http::HttpRequest load;
  load.method = "POST";
  load.path = "/v1/models/m/load";
  load.headers = {{"authorization", "Bearer k"}, {"content-type", "application/json"}};
  load.body = "{}";
  auto admin = std::make_shared<Recorder>();
  auto req = std::make_shared<Recorder>();
  const auto sent = Clock::now();
  (*router)->handle(load, admin);
  http::HttpRequest completion = completion_for("m");
  completion.headers.push_back({"authorization", "Bearer k"});
  (*router)->handle(completion, req);
  // The request waits its 0.3 s and gets a 503; the admin load waits for the load.
  ASSERT_EQ(req->wait(std::chrono::seconds(5)), 503) << req->body();
  ASSERT_EQ(admin->wait(std::chrono::seconds(5)), 500) << admin->body();
  EXPECT_GE(std::chrono::duration<double>(admin->at() - sent).count(), 0.9) << "answered before the load ended";
  EXPECT_NE(admin->body().find("test factory: no model"), std::string::npos) << admin->body();
}
