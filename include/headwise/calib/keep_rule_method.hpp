#pragma once
// A keep rule as calibration knows it (calib/keep_rules.hpp runs the pass): how a global layer
// runs with some of its KV heads filling their slots by the rule. What the rule costs besides
// its slots is the policy's (policy/keep_rule.hpp: every rule but window pays its layer's
// selection bookkeeping), so the pass prices every rule the same way and measures each by its
// method.
//
// Adding a rule is one file: a KeepRuleMethod and a static RegisterKeepRule. The pass tries it
// wherever `--keep-rules` (KeepRuleOptions::rules) allows it; the walk, the solver and the
// measures are not touched. The runtime decoder serves the rules it knows (runtime/decoder.cpp)
// and refuses others with one line, so a new rule also teaches the runtime how to serve it.
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/policy/keep_rule.hpp"

namespace headwise::calib {

// What a rule's run of a layer needs besides its inputs: the runtime's serving shape.
struct KeepRuleContext {
  const arch::ModelSpec& spec;
  const memory::MemoryOptions& memory;  // slots per window, sinks, block size
  int64_t prefill_chunk = 256;          // tokens per prefill chunk, as the runtime prefills
  int64_t attention_chunk = 512;        // query chunk of the attention kernels
  // Where the sequences' prompt ends (the first decoded position, the same for the batch:
  // prompt_end.hpp), for rules that choose at the prompt's end (snap); 0: not given, and such a
  // rule refuses.
  int64_t prompt_end = 0;
};

class KeepRuleMethod {
 public:
  virtual ~KeepRuleMethod() = default;
  // The rule's name in files and flags (policy::KeepRule::name); registering adds it.
  virtual std::string name() const = 0;
  // Layer `in.layer_id`'s attention output [batch, tokens, heads, head_dim] as the runtime serves
  // it when the KV heads in `heads` fill `windows[h]`'s slots by this rule and every other head
  // keeps its window. Each head's output may depend only on its own keys and queries (so the
  // pass can compose heads under different rules from one run per rule).
  virtual at::Tensor attend(const KeepRuleContext& context, const arch::AttentionInputs& in,
                            const std::vector<int64_t>& windows,
                            const std::set<int64_t>& heads) const = 0;
  // Whether the rule chooses once, at the prompt's end, with the question among its observing
  // queries (snap). The calibration then measures it only on answer positions after the prompt
  // end, where it no longer attends like full KV (prompt_end.hpp), and gives it the prompt end.
  virtual bool chooses_at_prompt_end() const { return false; }
  // Whether the rule may answer with far fewer slots than a window needs (snap): the pass then
  // offers it at every ladder level, not only at the head's window, and chooses every head's rule
  // and level jointly with one exact solve across the layers (joint_rules.hpp).
  virtual bool offered_at_every_level() const { return false; }
};

// Registers `method` under its name (policy::register_keep_rule_name), from a static
// initialiser: `static RegisterKeepRule r(std::make_unique<MyRule>());`. window and h2o are
// registered by the library.
class RegisterKeepRule {
 public:
  explicit RegisterKeepRule(std::unique_ptr<KeepRuleMethod> method);
};

// The method of a registered rule; InternalError for a rule with none.
const KeepRuleMethod& keep_rule_method(const policy::KeepRule& rule);

}  // namespace headwise::calib
