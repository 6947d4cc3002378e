#include "headwise/policy/serving.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <set>

namespace headwise::policy {
namespace {

// "layer 1 heads 0, 1, 2 (h2o); layer 3 head 0 (h2o)"
std::string selecting_heads(const Policy& policy) {
  std::vector<std::string> layers;
  for (const auto& layer : policy.per_layer_policies) {
    std::vector<std::string> heads;
    std::set<std::string> rules;
    for (size_t h = 0; h < layer.kv_head_windows.size(); ++h) {
      if (!layer.rule(h).selects_tokens()) continue;
      heads.push_back(std::to_string(h));
      rules.insert(layer.rule(h).name());
    }
    if (heads.empty()) continue;
    layers.push_back(fmt::format("layer {} head{} {} ({})", layer.layer_id,
                                 heads.size() > 1 ? "s" : "", fmt::join(heads, ", "),
                                 fmt::join(rules, ", ")));
  }
  return fmt::format("{}", fmt::join(layers, "; "));
}

}  // namespace

const std::vector<std::string>& vllm_served_model_types() {
  static const std::vector<std::string> kTypes = {
      "gemma3_text", "qwen3", "llama", "gpt_oss", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"};
  return kTypes;
}

std::string vllm_refusal(const Policy& policy, std::string_view model_type) {
  if (policy.selects_tokens()) {
    return fmt::format(
        "it has heads that select tokens ({}) and vLLM selects none: calibrate with --engine vllm "
        "(window rules, in vLLM's bytes) or --keep-rules window",
        selecting_heads(policy));
  }
  if (policy.sink_tokens > 0) {
    return fmt::format(
        "it keeps {} sink tokens and vLLM's sliding windows keep none: calibrate with "
        "--sink-tokens 0",
        policy.sink_tokens);
  }
  const auto& served = vllm_served_model_types();
  if (std::find(served.begin(), served.end(), model_type) == served.end()) {
    return fmt::format("python/headwise_vllm serves {} models, not {}", fmt::join(served, ", "),
                       model_type);
  }
  return {};
}

std::string serving_note(const Policy& policy, std::string_view model_type, std::string_view path) {
  const std::string refusal = vllm_refusal(policy, model_type);
  if (refusal.empty()) {
    // Its budget counted headwise's bytes unless it was calibrated for vLLM's (calib/engine.hpp).
    const std::string budget =
        policy.engine ? ""
                      : "; its budget counted headwise's cache, not what vLLM reserves for it "
                        "(--engine vllm calibrates in vLLM's bytes)";
    return fmt::format(
        "serving: {} runs in vLLM (HEADWISE_POLICY={} with python/headwise_vllm){}, in headwise's "
        "runtime (eval, forward --policy) and in transformers (python/headwise_hf); docs/deploy.md",
        path, path, budget);
  }
  return fmt::format(
      "serving: {} runs in headwise's runtime (eval, forward --policy) and in transformers "
      "(python/headwise_hf); not in vLLM or another paged engine: {} (docs/deploy.md)",
      path, refusal);
}

}  // namespace headwise::policy
