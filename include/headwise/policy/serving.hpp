#pragma once
// Where a policy can be served (docs/deploy.md, "Where each rule runs"), said at the end of a
// calibration so a user does not find out at deployment.
//
//   headwise's runtime decoder (eval, forward --policy): every policy.
//   transformers with python/headwise_hf's HeadwiseCache: every policy (h2o heads as the runtime
//     serves them, in the head's slots).
//   vLLM with python/headwise_vllm: windows only (no engine outside headwise selects tokens), no
//     sink tokens (vLLM's sliding windows keep none), and a family the plugin serves.
#include <string>
#include <string_view>
#include <vector>

#include "headwise/policy/policy.hpp"

namespace headwise::policy {

// model_type values python/headwise_vllm serves (its plan.SERVED_MODEL_TYPES).
const std::vector<std::string>& vllm_served_model_types();

// Why vLLM cannot serve `policy` for a model of `model_type`; empty when it can.
std::string vllm_refusal(const Policy& policy, std::string_view model_type);

// One line: where the policy at `path` runs and, when vLLM cannot serve it, why and what to do.
std::string serving_note(const Policy& policy, std::string_view model_type, std::string_view path);

}  // namespace headwise::policy
