// The h2o rule: a head's slots hold H2O's heavy hitters (by attention accumulated over the
// queries so far) and its most recent tokens, evicting after every prefill chunk and decode step
// exactly as the runtime's eviction cache does (runtime/eviction_cache.hpp).
#include "headwise/calib/keep_rule_method.hpp"
#include "headwise/runtime/eviction_cache.hpp"

namespace headwise::calib {
namespace {

class H2ORule final : public KeepRuleMethod {
 public:
  std::string name() const override { return policy::KeepRule::kH2O.name(); }

  at::Tensor attend(const KeepRuleContext& c, const arch::AttentionInputs& in,
                    const std::vector<int64_t>& windows,
                    const std::set<int64_t>& heads) const override {
    runtime::EvictionOptions eviction;
    eviction.method = runtime::EvictionMethod::kH2O;
    eviction.layers = {in.layer_id};
    for (int64_t h = 0; h < static_cast<int64_t>(windows.size()); ++h) {
      if (!heads.contains(h)) eviction.window_heads.insert({in.layer_id, h});
    }
    return runtime::simulate_eviction(c.spec, in, windows, c.memory, eviction, c.prefill_chunk,
                                      c.attention_chunk);
  }
};

const RegisterKeepRule kRegistered(std::make_unique<H2ORule>());

}  // namespace
}  // namespace headwise::calib
