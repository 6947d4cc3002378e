// The window rule: a head keeps its sinks and its most recent tokens, as the grouped cache does.
#include "headwise/arch/attention.hpp"
#include "headwise/calib/keep_rule_method.hpp"

namespace headwise::calib {
namespace {

class WindowRule final : public KeepRuleMethod {
 public:
  std::string name() const override { return policy::KeepRule::kWindow.name(); }

  at::Tensor attend(const KeepRuleContext& c, const arch::AttentionInputs& in,
                    const std::vector<int64_t>& windows, const std::set<int64_t>&) const override {
    return arch::windowed_attention(in, windows, c.memory.sink_tokens, c.attention_chunk);
  }
};

const RegisterKeepRule kRegistered(std::make_unique<WindowRule>());

}  // namespace
}  // namespace headwise::calib
