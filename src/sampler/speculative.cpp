#include "sampler/speculative.h"

#include <algorithm>

#include "common/status.h"

namespace serval {

DraftVerdict verify_draft(std::span<const Candidate> p, std::span<const Candidate> q, TokenId draft,
                          double u_accept, double u_resample, std::vector<float>* scratch) {
  SERVAL_ASSERT(!p.empty() && !q.empty() && scratch != nullptr);
  TokenId max_id = draft;
  for (const Candidate& c : p) max_id = std::max(max_id, c.token);
  for (const Candidate& c : q) max_id = std::max(max_id, c.token);
  std::vector<float>& qd = *scratch;  // dense q, zeros outside q
  if (qd.size() <= static_cast<size_t>(max_id)) qd.resize(static_cast<size_t>(max_id) + 1, 0.0f);
  double p_total = 0.0, q_total = 0.0;
  for (const Candidate& c : p) p_total += c.prob;
  for (const Candidate& c : q) {
    qd[static_cast<size_t>(c.token)] += c.prob;
    q_total += c.prob;
  }
  auto clear = [&] {
    for (const Candidate& c : q) qd[static_cast<size_t>(c.token)] = 0.0f;
  };
  SERVAL_ASSERT(p_total > 0.0 && q_total > 0.0 && qd[static_cast<size_t>(draft)] > 0.0f);

  double p_d = 0.0;
  for (const Candidate& c : p)
    if (c.token == draft) p_d += c.prob;
  p_d /= p_total;
  const double q_d = qd[static_cast<size_t>(draft)] / q_total;
  // Accept with probability min(1, p/q): u < p/q  <=>  u * q < p.
  if (u_accept * q_d < p_d) {
    clear();
    return {true, draft};
  }
  // Residual max(0, p - q) over p's support (where p = 0 the residual is 0).
  double r_total = 0.0;
  for (const Candidate& c : p)
    r_total += std::max(0.0, c.prob / p_total - qd[static_cast<size_t>(c.token)] / q_total);
  DraftVerdict v{false, p.front().token};
  if (r_total <= 0.0) {
    // Only reachable through rounding (a rejection implies p(d) < q(d), hence
    // some token with p > q): fall back to p itself.
    double cum = 0.0;
    const double target = u_resample * p_total;
    for (const Candidate& c : p) {
      cum += c.prob;
      v.token = c.token;
      if (cum > target) break;
    }
  } else {
    double cum = 0.0;
    const double target = u_resample * r_total;
    for (const Candidate& c : p) {
      const double r = std::max(0.0, c.prob / p_total - qd[static_cast<size_t>(c.token)] / q_total);
      if (r <= 0.0) continue;
      cum += r;
      v.token = c.token;
      if (cum > target) break;
    }
  }
  clear();
  return v;
}

DraftVerdict verify_draft(std::span<const Candidate> p, std::span<const Candidate> q, TokenId draft, Rng& rng,
                          std::vector<float>* scratch) {
  const double ua = rng.uniform();
  // The resampling draw is taken only on rejection; peeking it here would
  // change the stream's position for accepted tokens.
  Rng copy = rng;
  const DraftVerdict v = verify_draft(p, q, draft, ua, copy.uniform(), scratch);
  if (!v.accepted) rng.uniform();
  return v;
}

}  // namespace serval
