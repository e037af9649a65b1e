// The gateway's configuration file, prefix index, router and key limits (no sockets).
#include <gtest/gtest.h>

#include <thread>

#include "gateway/gateway_config.h"
#include "gateway/key_limits.h"
#include "gateway/ledger.h"
#include "gateway/prefix_index.h"
#include "gateway/router.h"

namespace serval::gateway {
namespace {

const char* kGood = R"(
[server]
port = 0
max_inflight = 64

[routing]
policy = "round_robin"
chunk_chars = 16

[[models]]
name = "chat"
aliases = ["gpt-4o-mini"]
upstreams = ["http://127.0.0.1:9001", "http://127.0.0.1:9002/v1/"]
fallback = ["backup"]
price_input_per_mtok = 1.5

[[models]]
name = "backup"
upstreams = ["http://[::1]:9003"]

[[keys]]
name = "team-a"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
rpm = 60
models = ["chat"]
budget = 2.5
budget_period = "day"
)";

TEST(GatewayConfig, ParsesEveryField) {
  auto c = parse_gateway_config(kGood, "g.toml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->port, 0);
  EXPECT_EQ(c->max_inflight, 64);
  EXPECT_EQ(c->policy, Policy::round_robin);
  EXPECT_EQ(c->chunk_chars, 16);
  ASSERT_EQ(c->models.size(), 2u);
  EXPECT_EQ(c->models[0].aliases, std::vector<std::string>{"gpt-4o-mini"});
  ASSERT_EQ(c->models[0].upstreams.size(), 2u);
  EXPECT_EQ(c->models[0].upstreams[1].url, "http://127.0.0.1:9002");  // trailing /v1/ dropped
  EXPECT_EQ(c->models[0].upstreams[1].base, "");
  EXPECT_EQ(c->models[1].upstreams[0].host, "::1");
  EXPECT_EQ(c->models[1].upstreams[0].host_header, "[::1]:9003");
  EXPECT_DOUBLE_EQ(c->models[0].price_input_per_mtok, 1.5);
  ASSERT_EQ(c->keys.size(), 1u);
  EXPECT_EQ(c->keys[0].budget_period, BudgetPeriod::day);
  EXPECT_EQ(c->keys[0].rpm, 60);
}

// Each bad file: the message names the file, line and key.
TEST(GatewayConfig, ErrorsNameKeyAndLine) {
  struct Case {
    std::string text, expect;
  } cases[] = {
      {"[server]\nport = 70000\n[[models]]\nname='a'\nupstreams=['http://h:1']\n", "g.toml:2: server.port: expected a number in [0, 65535]"},
      {"[server]\nprot = 1\n", "g.toml:2: server.prot: unknown key"},
      {"[[models]]\nname = 'a'\nupstreams = ['localhost:8080']\n", "g.toml:3: models[0].upstreams[0]: expected a URL http://host:port"},
      {"[[models]]\nname = 'a'\nupstreams = []\n", "models[0].upstreams: expected at least one upstream URL"},
      {"[[models]]\nname = 'a'\nupstreams = ['http://h:1']\nfallback = ['zzz']\n", "g.toml:1: models[0].fallback: no model named 'zzz'"},
      {"[routing]\npolicy = 'random'\n", "g.toml:2: routing.policy: expected \"cache_aware\", \"round_robin\" or \"least_loaded\""},
      {"[[models]]\nname = 'a'\nupstreams = ['http://h:1']\n[[keys]]\nname = 'k'\nsha256 = 'abc'\n", "g.toml:6: keys[0].sha256: expected the key's SHA-256"},
      {"[server\nport = 1\n", "g.toml:1:"},
      {"", "no [[models]] entry"},
      {"[[models]]\nname = 'a'\nupstreams = ['http://h:1']\n[[models]]\nname = 'b'\naliases = ['a']\nupstreams = ['http://h:2']\n",
       "models[1]: model name or alias 'a' is used twice"},
      {"[[models]]\nname = 'a'\nupstreams = ['https://h:1']\n", "TLS upstreams are not supported"},
      {"[retry]\nattempts = 1.5\n", "g.toml:2: retry.attempts: expected an integer"},
      {"[[models]]\nname = 'a'\nupstreams = ['http://h:1']\napi_key_file = '/nonexistent/keys'\n",
       "g.toml:4: models[0].api_key_file: cannot read '/nonexistent/keys'"},
      {"[[models]]\nname = 'a'\nupstreams = ['http://h:1']\ndiscovery = 'k8s'\n", "g.toml:4: models[0].discovery: expected \"static\" or \"dns\""},
  };
  for (const auto& c : cases) {
    auto r = parse_gateway_config(c.text, "g.toml");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << "got: " << r.status().message() << "\nwant: " << c.expect;
  }
}

TEST(GatewayConfig, ApiKeyFileGivesTheFirstLine) {
  const std::string path = ::testing::TempDir() + "/gw-key-" + std::to_string(::getpid());
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs("\nsk-upstream-1\r\nsk-upstream-2\n", f);
  std::fclose(f);
  auto c = parse_gateway_config("[[models]]\nname='a'\nupstreams=['http://h:1']\napi_key_file='" + path + "'\n", "g.toml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->models[0].api_key, "sk-upstream-1");
  std::remove(path.c_str());
}

// The documented example (deploy/gateway/gateway.toml) is a valid file.
TEST(GatewayConfig, TheDocumentedExampleParses) {
  auto c = load_gateway_config(std::string(SERVAL_SOURCE_DIR) + "/deploy/gateway/gateway.toml");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->models.size(), 2u);
  EXPECT_EQ(c->admin_key_sha256, sha256_hex("change-me-admin-key"));  // as its comment says
  EXPECT_EQ(c->keys[0].sha256, sha256_hex("test"));
  EXPECT_TRUE(c->require_key);
}

TEST(GatewayConfig, Sha256MatchesKnownVector) {
  EXPECT_EQ(sha256_hex("test"), "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");  // FIPS 180 example, "test"
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(PrefixIndex, MatchesLeadingChunksAndEvictsDeepestFirst) {
  const auto a = prefix_chunk_hashes("aaaabbbbccccdddd", 4);
  const auto b = prefix_chunk_hashes("aaaabbbbxxxxyyyy", 4);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_EQ(a[1], b[1]);
  EXPECT_NE(a[2], b[2]);
  // Chained: the same chunk text after a different prefix is a different key.
  EXPECT_NE(prefix_chunk_hashes("zzzzbbbb", 4)[1], a[1]);
  EXPECT_TRUE(prefix_chunk_hashes("abc", 4).empty());  // no full chunk

  PrefixIndex idx(6);
  idx.insert(a);
  EXPECT_EQ(idx.match(a), 4u);
  EXPECT_EQ(idx.match(b), 2u);
  idx.insert(b);  // 2 new keys: 6 in all
  EXPECT_EQ(idx.size(), 6u);
  idx.insert(prefix_chunk_hashes("qqqqrrrr", 4));  // 2 more: the 2 least recent (a's tail) go
  EXPECT_EQ(idx.size(), 6u);
  EXPECT_EQ(idx.match(b), 4u);
  EXPECT_EQ(idx.match(a), 2u);  // the shared head stayed: a prefix outlives its extensions
}

BreakerConfig bc() { return BreakerConfig{2, 0.05, 0.2}; }

TEST(Router, BreakerOpensHalfOpensAndCloses) {
  Replica r(*parse_upstream_url("http://127.0.0.1:1"), 64, bc());
  auto now = Clock::now();
  EXPECT_TRUE(r.can_admit(now));
  r.on_failure(now);
  EXPECT_EQ(r.breaker_state(now), BreakerState::closed);
  r.on_failure(now);
  EXPECT_EQ(r.breaker_state(now), BreakerState::open);
  EXPECT_FALSE(r.can_admit(now));
  EXPECT_FALSE(r.admit(now));
  now += std::chrono::milliseconds(60);
  EXPECT_EQ(r.breaker_state(now), BreakerState::half_open);
  EXPECT_TRUE(r.admit(now));   // the one trial
  EXPECT_FALSE(r.admit(now));  // no second while it runs
  r.on_failure(now);           // trial failed: open again, period doubled (0.1 s)
  EXPECT_EQ(r.breaker_state(now + std::chrono::milliseconds(60)), BreakerState::open);
  now += std::chrono::milliseconds(110);
  EXPECT_TRUE(r.admit(now));
  r.on_success();
  EXPECT_EQ(r.breaker_state(now), BreakerState::closed);
  // A passing health check after the open period closes it too.
  r.on_failure(now);
  r.on_failure(now);
  EXPECT_EQ(r.breaker_state(now), BreakerState::open);
  r.on_health(true, now);  // too early: stays open
  EXPECT_EQ(r.breaker_state(now), BreakerState::open);
  r.on_health(true, now + std::chrono::milliseconds(60));
  EXPECT_EQ(r.breaker_state(now + std::chrono::milliseconds(60)), BreakerState::closed);
  // Unhealthy: not routable whatever the breaker says.
  r.on_health(false, now);
  EXPECT_FALSE(r.can_admit(now));
}

TEST(Router, PoliciesPickAsSpecified) {
  std::vector<std::unique_ptr<Replica>> owned;
  std::vector<Replica*> rs;
  for (int i = 0; i < 3; ++i) {
    owned.push_back(std::make_unique<Replica>(*parse_upstream_url("http://127.0.0.1:" + std::to_string(9000 + i)), 1024, bc()));
    rs.push_back(owned.back().get());
  }
  const auto now = Clock::now();
  std::atomic<uint64_t> rr{0};
  RoutingConfig cfg;
  cfg.policy = Policy::round_robin;
  std::vector<int> seen;
  for (int i = 0; i < 6; ++i) seen.push_back(choose_replica(rs, {}, {}, cfg, rr, now).index);
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 0, 1, 2}));

  cfg.policy = Policy::least_loaded;
  rs[0]->inflight = 5;
  rs[1]->inflight = 1;
  rs[2]->inflight = 3;
  EXPECT_EQ(choose_replica(rs, {}, {}, cfg, rr, now).index, 1);
  EXPECT_EQ(choose_replica(rs, {rs[1]}, {}, cfg, rr, now).index, 2);  // excluded: next least loaded
  rs[1]->set_scraped(4, 4, 0.5);                                  // scraped load beats its in-flight count
  EXPECT_EQ(choose_replica(rs, {}, {}, cfg, rr, now).index, 2);

  cfg.policy = Policy::cache_aware;
  cfg.balance_abs_threshold = 8;
  for (auto* r : rs) r->inflight = 0, r->set_scraped(0, 0, 0);
  const auto h = prefix_chunk_hashes(std::string(64, 'p') + "suffix--", 8);
  rs[2]->prefix().insert(h);
  auto c = choose_replica(rs, {}, h, cfg, rr, now);
  EXPECT_EQ(c.index, 2);
  EXPECT_EQ(c.reason, "prefix");
  EXPECT_EQ(c.matched_chunks, h.size());
  // Below the threshold: least loaded.
  cfg.cache_threshold = 1.01;
  rs[0]->inflight = 2;
  rs[2]->inflight = 1;
  c = choose_replica(rs, {}, h, cfg, rr, now);
  EXPECT_EQ(c.index, 1);
  EXPECT_EQ(c.reason, "least_loaded");
  // Imbalance beyond both thresholds: least loaded even with a full match.
  cfg.cache_threshold = 0.5;
  rs[2]->inflight = 20;
  c = choose_replica(rs, {}, h, cfg, rr, now);
  EXPECT_EQ(c.reason, "balance");
  EXPECT_EQ(c.index, 1);
  // Nothing routable.
  for (auto* r : rs) r->on_health(false, now);
  EXPECT_EQ(choose_replica(rs, {}, h, cfg, rr, now).index, -1);
}

TEST(KeyLimits, RpmTpmAndParallel) {
  KeyConfig k;
  k.name = "k";
  k.sha256 = sha256_hex("k");
  k.rpm = 2;
  k.tpm = 100;
  k.max_parallel = 2;
  KeyRegistry reg;
  reg.put(k, true);
  auto s = reg.find_by_hash(sha256_hex("k"));
  ASSERT_TRUE(s);
  auto now = Clock::now();
  EXPECT_EQ(admit_key(*s, now).status, 0);
  EXPECT_EQ(admit_key(*s, now).status, 0);
  auto a = admit_key(*s, now);  // third in flight
  EXPECT_EQ(a.status, 429);
  EXPECT_EQ(a.code, "max_parallel_requests");
  finish_key(*s, 150, now);  // TPM driven negative
  a = admit_key(*s, now);
  EXPECT_EQ(a.code, "rate_limit_tpm");
  EXPECT_NEAR(a.retry_after_s, 50 / (100 / 60.0), 1e-6);
  finish_key(*s, 0, now);
  now += std::chrono::seconds(40);  // TPM refilled past zero (+66); RPM +1.33
  EXPECT_EQ(admit_key(*s, now).status, 0);
  a = admit_key(*s, now);
  EXPECT_EQ(a.code, "rate_limit_rpm");
  EXPECT_GT(a.retry_after_s, 0);
  EXPECT_EQ(a.message, "key 'k' is over its requests-per-minute limit (rpm 2)");
}

TEST(Ledger, RecordsOnceAndSurvivesReopen) {
  const std::string path = ::testing::TempDir() + "/gw-ledger-" + std::to_string(::getpid()) + ".db";
  std::remove(path.c_str());
  {
    auto l = Ledger::open(path);
    ASSERT_TRUE(l.ok()) << l.status().message();
    (*l)->record({"r1", "team", "chat", "2026-12-01", 10, 5, 0.25});
    (*l)->record({"r2", "team", "chat", "2026-12-01", 1, 1, 0.5});
    (*l)->record({"r3", "team", "chat", "2026-12-03", 2, 2, 1.0});
    (*l)->record({"r4", "other", "chat", "2026-12-03", 2, 2, 7.0});
    KeyConfig k;
    k.name = "made";
    k.sha256 = sha256_hex("secret-secret-secret");
    k.rpm = 5;
    k.models = {"chat"};
    ASSERT_TRUE((*l)->put_key(k).ok());
    EXPECT_FALSE((*l)->put_key(k).ok());  // same name again
    EXPECT_DOUBLE_EQ((*l)->spend("team", BudgetPeriod::day, "2026-12-01"), 0.75);
    EXPECT_DOUBLE_EQ((*l)->spend("team", BudgetPeriod::month, "2026-12-20"), 1.75);
    EXPECT_DOUBLE_EQ((*l)->spend("team", BudgetPeriod::day, "2026-12-02"), 0);
  }
  {
    auto l = Ledger::open(path);
    ASSERT_TRUE(l.ok());
    auto rows = (*l)->usage("team", "", "");
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_EQ(rows[0].day, "2026-12-01");
    EXPECT_EQ(rows[0].requests, 2);
    EXPECT_EQ(rows[0].prompt_tokens, 11);
    EXPECT_DOUBLE_EQ((*l)->spend("team", BudgetPeriod::total, "2026-12-03"), 1.75);
    EXPECT_EQ((*l)->usage("", "2026-12-02", "2026-12-31").size(), 2u);
    // A request id seen before is not counted again (a replayed record).
    (*l)->record({"r1", "team", "chat", "2026-12-01", 10, 5, 0.25});
    auto keys = (*l)->keys();
    ASSERT_EQ(keys.size(), 1u);
    EXPECT_EQ(keys[0].name, "made");
    EXPECT_EQ(keys[0].models, std::vector<std::string>{"chat"});
    EXPECT_EQ(keys[0].rpm, 5);
  }
  {
    auto l = Ledger::open(path);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ((*l)->usage("team", "2026-12-01", "2026-12-01")[0].requests, 2);  // the replay did not land on disk
  }
  std::remove(path.c_str());
}

TEST(Ledger, RefusesAForeignFile) {
  const std::string path = ::testing::TempDir() + "/gw-foreign-" + std::to_string(::getpid()) + ".db";
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fputs("this is not a database, just text that is long enough to look like a header...........", f);
  std::fclose(f);
  auto l = Ledger::open(path);
  EXPECT_FALSE(l.ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace serval::gateway
