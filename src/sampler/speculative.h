// Speculative verification (Leviathan et al. 2023; Chen et al. 2023): decides
// whether a drafted token is kept so that the emitted token is distributed
// exactly as the target's final distribution p, whatever the draft's q.
//
//   accept d with probability min(1, p(d) / q(d));
//   on rejection draw from the residual max(0, p - q), normalised.
//
// p and q are final distributions (Sampler::distribution(): after penalties,
// bias, temperature, top-k/typical/top-p/min-p), as (token, prob) lists in any
// order; a token absent from a list has probability 0. An n-gram draft is a
// point mass: q = {d: 1}. Greedy decoding needs none of this (the engine keeps
// a draft token iff it equals the target's argmax).
//
// Stateless free functions; thread-compatible.
#pragma once

#include <span>
#include <vector>

#include "sampler/logit_processors.h"
#include "sampler/rng.h"

namespace serval {

struct DraftVerdict {
  bool accepted = false;
  TokenId token = 0;  // the draft token if accepted, else the residual's draw
};

// u_accept, u_resample: independent uniforms in [0, 1) (u_resample is used only
// on rejection). `scratch` is resized to cover the largest token id of p and q
// and left all zeros. q must give `draft` a positive probability.
DraftVerdict verify_draft(std::span<const Candidate> p, std::span<const Candidate> q, TokenId draft,
                          double u_accept, double u_resample, std::vector<float>* scratch);

// Same, drawing the uniforms from `rng`: one draw, two on rejection.
DraftVerdict verify_draft(std::span<const Candidate> p, std::span<const Candidate> q, TokenId draft, Rng& rng,
                          std::vector<float>* scratch);

}  // namespace serval
