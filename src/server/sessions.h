// Saved prefixes ("sessions"): a client names a conversation's prompt so far
// (POST /v1/sessions/{id}/save), serval pins its KV blocks on the disk tier of
// the prefix cache (Engine::prefix_op) so that no LRU eviction drops them,
// and /restore brings them back into the KV pool before the conversation
// resumes. The store keeps what names a session — owner, prefix-cache
// namespace, token ids — one JSON file per session under
// <kv-cache-dir>/sessions/, so the pins are re-applied after a restart.
//
// Ownership: a session belongs to the API key that saved it (owner_of: a hash,
// never the key); ids are per owner, so another key neither sees nor touches
// it (404). Bounded: id syntax, number of sessions, file size on reading.
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "serval/types.h"

namespace serval::server {

struct Session {
  std::string id;     // the client's name for it: valid_session_id()
  std::string owner;  // OpenAiServer::owner_of
  uint64_t salt = 0;  // the owner's prefix-cache namespace
  std::vector<TokenId> tokens;
  int64_t saved_tokens = 0;  // of tokens, the full blocks pinned when it was saved
  int64_t created = 0;       // unix seconds
};

// 1..128 of [A-Za-z0-9_.-], not starting with '.'.
bool valid_session_id(std::string_view id);

class SessionStore {
 public:
  // Creates dir if needed and reads every session file in it (a file that
  // does not parse is skipped and named in *skipped).
  static Expected<std::unique_ptr<SessionStore>> open(const std::string& dir, size_t max_sessions,
                                                      std::vector<std::string>* skipped = nullptr);

  std::optional<Session> get(const std::string& owner, const std::string& id) const;
  // Adds or replaces (same owner and id). resource_exhausted past
  // max_sessions; internal when the file cannot be written.
  Status put(const Session& s);
  bool erase(const std::string& owner, const std::string& id);
  std::vector<Session> list(const std::string& owner) const;  // by id
  std::vector<Session> all() const;
  size_t max_sessions() const { return max_; }

 private:
  SessionStore(std::string dir, size_t max) : dir_(std::move(dir)), max_(max) {}
  std::string path_of(const std::string& owner, const std::string& id) const;

  std::string dir_;
  size_t max_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, Session> by_key_;  // (owner, id)
};

}  // namespace serval::server
