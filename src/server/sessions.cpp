#include "server/sessions.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "server/batch_store.h"

namespace serval::server {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr uintmax_t kMaxFileBytes = 64u << 20;  // a session file is token ids: far below this

json to_json(const Session& s) {
  return {{"id", s.id},         {"owner", s.owner},   {"salt", s.salt},
          {"tokens", s.tokens}, {"saved_tokens", s.saved_tokens}, {"created", s.created}};
}

bool from_json(const json& j, Session* s) {
  try {
    s->id = j.at("id").get<std::string>();
    s->owner = j.at("owner").get<std::string>();
    s->salt = j.at("salt").get<uint64_t>();
    s->tokens = j.at("tokens").get<std::vector<TokenId>>();
    s->saved_tokens = j.at("saved_tokens").get<int64_t>();
    s->created = j.at("created").get<int64_t>();
  } catch (const std::exception&) {
    return false;
  }
  return valid_session_id(s->id) && !s->owner.empty() && s->owner.size() <= 64;
}

}  // namespace

bool valid_session_id(std::string_view id) {
  if (id.empty() || id.size() > 128 || id[0] == '.') return false;
  for (char c : id)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
          c == '.'))
      return false;
  return true;
}

Expected<std::unique_ptr<SessionStore>> SessionStore::open(const std::string& dir, size_t max_sessions,
                                                           std::vector<std::string>* skipped) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir, ec)) return invalid_argument("sessions directory " + dir + ": cannot be created");
  std::unique_ptr<SessionStore> st(new SessionStore(dir, max_sessions));
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path p = it->path();
    if (p.extension() == ".tmp") {
      fs::remove(p, ec);
      continue;
    }
    if (p.extension() != ".json") continue;
    Session s;
    bool ok = false;
    if (it->is_regular_file(ec) && fs::file_size(p, ec) <= kMaxFileBytes) {
      std::ifstream in(p);
      const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
      ok = j.is_object() && from_json(j, &s) && p.filename().string() == fs::path(st->path_of(s.owner, s.id)).filename().string();
    }
    if (!ok || st->by_key_.size() >= max_sessions) {
      if (skipped) skipped->push_back(p.filename().string());
      continue;
    }
    st->by_key_[{s.owner, s.id}] = std::move(s);
  }
  return st;
}

std::string SessionStore::path_of(const std::string& owner, const std::string& id) const {
  char h[17];
  std::snprintf(h, sizeof h, "%016llx", (unsigned long long)fnv1a64(owner));
  return (fs::path(dir_) / (std::string(h) + "-" + id + ".json")).string();
}

std::optional<Session> SessionStore::get(const std::string& owner, const std::string& id) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_key_.find({owner, id});
  if (it == by_key_.end()) return std::nullopt;
  return it->second;
}

Status SessionStore::put(const Session& s) {
  std::lock_guard<std::mutex> lk(mu_);
  const auto key = std::make_pair(s.owner, s.id);
  if (!by_key_.count(key) && by_key_.size() >= max_)
    return Status(StatusCode::resource_exhausted,
                  "too many saved sessions (" + std::to_string(max_) + "; --max-sessions); delete some");
  const std::string path = path_of(s.owner, s.id), tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << to_json(s).dump();
    if (!out.good()) return Status(StatusCode::internal, "cannot write " + tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status(StatusCode::internal, "cannot write " + path + ": " + ec.message());
  by_key_[key] = s;
  return {};
}

bool SessionStore::erase(const std::string& owner, const std::string& id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_key_.find({owner, id});
  if (it == by_key_.end()) return false;
  std::error_code ec;
  fs::remove(path_of(owner, id), ec);
  by_key_.erase(it);
  return true;
}

std::vector<Session> SessionStore::list(const std::string& owner) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Session> out;
  for (const auto& [k, s] : by_key_)
    if (k.first == owner) out.push_back(s);
  return out;
}

std::vector<Session> SessionStore::all() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<Session> out;
  for (const auto& [k, s] : by_key_) out.push_back(s);
  return out;
}

}  // namespace serval::server
