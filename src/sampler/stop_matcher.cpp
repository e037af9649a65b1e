#include "sampler/stop_matcher.h"

#include <algorithm>
#include <utility>

#include "common/status.h"

namespace serval {

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

bool StopMatcher::feed(std::string_view piece, std::string& out) {
  SERVAL_ASSERT(!stopped());
  pending_.append(piece);

  // 1. The stop string whose first occurrence ends earliest; among those
  // ending at the same byte, the longest (earliest start). pending_ holds no
  // complete stop string from earlier feeds, and no occurrence can start in
  // already-emitted text (that text was held back while it could).
  size_t best_end = std::string::npos;
  size_t best_start = 0;
  int best = -1;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const std::string& s = stops_[i];
    if (s.empty()) continue;
    const size_t pos = pending_.find(s);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (best < 0 || end < best_end || (end == best_end && pos < best_start)) {
      best_end = end;
      best_start = pos;
      best = static_cast<int>(i);
    }
  }
  if (best >= 0) {
    out.append(pending_, 0, best_start);
    pending_.clear();
    matched_ = best;
    return true;
  }

  // 2. Hold back the longest tail of pending_ that is a proper prefix of a
  // stop string; emit the rest.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    // Candidate tail lengths longer than `hold`, shorter than s.
    const size_t max_len = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size());
    for (size_t len = max_len; len > hold; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  const size_t emit = pending_.size() - hold;
  out.append(pending_, 0, emit);
  pending_.erase(0, emit);
  return false;
}

void StopMatcher::finish(std::string& out) {
  if (stopped()) return;
  out.append(pending_);
  pending_.clear();
}

}  // namespace serval
