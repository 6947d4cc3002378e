// The snap rule: at the prompt's end a head keeps, in its slots, the keys the prompt's last
// queries attend to most (SnapKV's selection per head, docs/keep-rules.md), then decodes with
// them and a ring of the most recent tokens, exactly as the runtime's eviction cache does
// (runtime/eviction_cache.hpp, EvictionOptions::snap_heads).
#include "headwise/calib/keep_rule_method.hpp"
#include "headwise/core/error.hpp"
#include "headwise/runtime/eviction_cache.hpp"

namespace headwise::calib {
namespace {

class SnapRule final : public KeepRuleMethod {
 public:
  std::string name() const override { return policy::KeepRule::kSnap.name(); }

  // The layer over the whole sequence: the prompt [0, prompt_end) in the runtime's prefill
  // chunks, the rest decoded token by token. Without a prompt end there is no question to
  // select with, so the rule refuses.
  at::Tensor attend(const KeepRuleContext& c, const arch::AttentionInputs& in,
                    const std::vector<int64_t>& windows,
                    const std::set<int64_t>& heads) const override {
    const int64_t steps = in.q.size(2);
    if (c.prompt_end <= 0 || c.prompt_end > steps) {
      throw_input_error(
          "keep rule snap: layer {} needs the sequences' prompt end (the first answer position) "
          "in 1..{}, got {}",
          in.layer_id, steps, c.prompt_end);
    }
    runtime::EvictionOptions eviction;
    eviction.method = runtime::EvictionMethod::kH2O;  // the policy's mixed mode
    eviction.layers = {in.layer_id};
    for (int64_t h = 0; h < static_cast<int64_t>(windows.size()); ++h) {
      (heads.contains(h) ? eviction.snap_heads : eviction.window_heads).insert({in.layer_id, h});
    }
    return runtime::simulate_eviction(c.spec, in, windows, c.memory, eviction, c.prefill_chunk,
                                      c.attention_chunk, c.prompt_end);
  }

  bool chooses_at_prompt_end() const override { return true; }
  bool offered_at_every_level() const override { return true; }
};

const RegisterKeepRule kRegistered(std::make_unique<SnapRule>());

}  // namespace
}  // namespace headwise::calib
