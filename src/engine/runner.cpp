#include "engine/runner.h"

namespace serval {

Status Runner::execute(const SchedulerOutput& out, std::vector<float>* logits) {
  // Order matters: swap out before the blocks are reused by copies or swap-ins.
  for (const BlockSwap& s : out.swap_out) kv_.swap_out(s);
  for (const BlockSwap& s : out.swap_in) kv_.swap_in(s);
  for (const BlockCopy& c : out.copies) kv_.copy_block(c.src, c.dst);
  batch_.tokens.clear();
  batch_.seqs.clear();
  for (const ScheduledSeq& s : out.seqs) {
    batch_.tokens.insert(batch_.tokens.end(), s.tokens.begin(), s.tokens.end());
    batch_.seqs.push_back({s.start_pos, s.n_tokens, s.block_table, s.needs_logits});
  }
  return forward_.forward(batch_, logits);
}

}  // namespace serval
