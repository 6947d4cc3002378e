// A global layer's keep-rule trials (layer_trials.hpp).
#include "calib/rules/layer_trials.hpp"

#include <fmt/format.h>

#include "headwise/core/error.hpp"
#include "headwise/core/window.hpp"

namespace headwise::calib::trials {

std::map<policy::KeepRule, std::set<int64_t>> heads_by_rule(const Trial& trial) {
  std::map<policy::KeepRule, std::set<int64_t>> out;
  for (const auto& [head, rule] : trial) out[rule].insert(head);
  return out;
}

std::set<int64_t> trial_heads(const Trial& trial) {
  std::set<int64_t> out;
  for (const auto& entry : trial) out.insert(entry.first);
  return out;
}

void copy_head(at::Tensor& into, const at::Tensor& from, int64_t h, int64_t kv_heads) {
  const int64_t group = from.size(2) / kv_heads;
  into.slice(2, h * group, (h + 1) * group).copy_(from.slice(2, h * group, (h + 1) * group));
}

at::Tensor run_trial(const KeepRuleContext& context, const arch::AttentionInputs& in,
                     const std::vector<int64_t>& windows, const Trial& trial) {
  const auto by_rule = heads_by_rule(trial);
  if (by_rule.empty()) {
    return keep_rule_method(policy::KeepRule::kWindow).attend(context, in, windows, {});
  }
  at::Tensor out;
  for (const auto& [rule, heads] : by_rule) {
    const at::Tensor run = keep_rule_method(rule).attend(context, in, windows, heads);
    if (!out.defined()) {
      out = by_rule.size() == 1 ? run : run.clone();  // its other heads keep their windows
      continue;
    }
    for (int64_t h : heads) copy_head(out, run, h, static_cast<int64_t>(windows.size()));
  }
  return out;
}

at::Tensor RuleCore::attend(const arch::AttentionInputs& in) {
  if (in.layer_id != layer_) return exact_.attend(in);
  return run_trial(context_, in, windows_, trial_);
}

SpanOutputs SpanTrials::compose(const std::vector<int64_t>& windows, const Trial& trial) {
  SpanOutputs out;
  const auto kv = static_cast<int64_t>(windows.size());
  for (size_t m = 0; m < site_.input.size(); ++m) {
    at::Tensor composed;
    for (int64_t h = 0; h < kv; ++h) {
      const int64_t w = windows[static_cast<size_t>(h)];
      const auto rule = trial.find(h);
      const at::Tensor& source = rule != trial.end() ? under(rule->second, w)[m]
                                                     : site_.levels.at(w)[m];  // [Bm, S, heads, hd]
      if (!composed.defined()) composed = at::empty_like(source);
      copy_head(composed, source, h, kv);
    }
    out.push_back(composed);
  }
  return out;
}

const SpanOutputs& SpanTrials::under(const policy::KeepRule& rule, int64_t window) {
  const auto key = std::make_pair(rule, window);
  auto it = runs_.find(key);
  if (it != runs_.end()) return it->second;
  std::vector<int64_t> windows = base_;
  for (int64_t h : candidates_) windows[static_cast<size_t>(h)] = window;
  SpanOutputs outputs;
  for (const auto& in : site_.attention) {
    HEADWISE_CHECK(in.layer_id == site_.layer, "span site of layer {} holds layer {}'s inputs",
                   site_.layer, in.layer_id);
    const at::Tensor all = keep_rule_method(rule).attend(context_, in, windows, candidates_);
    outputs.push_back(all.slice(1, all.size(1) - site_.input.front().size(1), all.size(1)));
  }
  return runs_.emplace(key, std::move(outputs)).first->second;
}

std::string rules_label(const std::vector<int64_t>& windows, const Trial& trial) {
  std::string out;
  for (size_t h = 0; h < windows.size(); ++h) {
    const auto rule = trial.find(static_cast<int64_t>(h));
    out += fmt::format("{}{}{}", h == 0 ? "" : ",", window_label(windows[h]),
                       rule == trial.end() ? "" : ":" + rule->second.name());
  }
  return "[" + out + "]";
}

std::vector<Trial> every_trial(const std::vector<int64_t>& candidates,
                               const std::vector<policy::KeepRule>& rules) {
  const size_t choices = rules.size() + 1;
  size_t count = 1;
  for (size_t c = 0; c < candidates.size(); ++c) {
    count *= choices;
    if (count > kBatchedTrials) return {Trial{}};
  }
  std::vector<Trial> out;
  for (size_t code = 0; code < count; ++code) {
    Trial trial;
    size_t rest = code;
    for (int64_t head : candidates) {
      const size_t digit = rest % choices;
      rest /= choices;
      if (digit > 0) trial.emplace(head, rules[digit - 1]);
    }
    out.push_back(std::move(trial));
  }
  return out;
}

std::vector<int64_t> evicting_heads(const std::vector<int64_t>& base, int64_t tokens,
                                    const memory::MemoryOptions& memory) {
  std::vector<int64_t> out;
  for (int64_t h = 0; h < static_cast<int64_t>(base.size()); ++h) {
    if (memory::global_head_slots(base[static_cast<size_t>(h)], memory) < tokens) out.push_back(h);
  }
  return out;
}

std::vector<policy::KeepRule> rules_of(const Trial& chosen, size_t heads) {
  std::vector<policy::KeepRule> rules(heads, policy::KeepRule::kWindow);
  for (const auto& [h, rule] : chosen) rules[static_cast<size_t>(h)] = rule;
  return rules;
}

}  // namespace headwise::calib::trials
