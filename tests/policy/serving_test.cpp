// Where a policy can be served (policy/serving.hpp): the note calibrate prints at the end.
#include <catch2/catch.hpp>

#include "headwise/policy/serving.hpp"

using namespace headwise;

namespace {

policy::Policy two_layer_policy() {
  policy::Policy p;
  p.sink_tokens = 0;
  p.per_layer_policies = {{1, {448, 448, 512, 512}, {}, {}},
                          {3, {policy::kFull, 2048, policy::kFull, 512}, {}, {}}};
  return p;
}

}  // namespace

TEST_CASE("serving note: a windows-only policy of a family vLLM serves runs everywhere",
          "[policy]") {
  policy::Policy p = two_layer_policy();
  CHECK(policy::vllm_refusal(p, "gemma3_text").empty());
  const std::string note = policy::serving_note(p, "llama", "out/policy.yaml");
  CHECK(note.find("runs in vLLM (HEADWISE_POLICY=out/policy.yaml") != std::string::npos);
  CHECK(note.find("not in vLLM") == std::string::npos);
  // Calibrated in headwise's bytes: the note says its budget is not vLLM's reservation.
  CHECK(note.find("--engine vllm") != std::string::npos);
  p.engine = policy::EngineRecord{};
  CHECK(policy::serving_note(p, "llama", "out/policy.yaml").find("--engine vllm") ==
        std::string::npos);
}

TEST_CASE(
    "serving note: h2o heads name the heads, the engines that cannot run them and --keep-rules "
    "window",
    "[policy]") {
  policy::Policy p = two_layer_policy();
  p.per_layer_policies[0].kv_head_rules = {policy::KeepRule::kH2O, policy::KeepRule::kH2O,
                                           policy::KeepRule::kH2O, policy::KeepRule::kWindow};
  const std::string note = policy::serving_note(p, "gemma3_text", "out/policy.yaml");
  CHECK(note.find("headwise's runtime") != std::string::npos);
  CHECK(note.find("python/headwise_hf") != std::string::npos);
  CHECK(note.find("not in vLLM") != std::string::npos);
  CHECK(note.find("layer 1 heads 0, 1, 2 (h2o)") != std::string::npos);
  CHECK(note.find("--keep-rules window") != std::string::npos);
  CHECK(note.find("--engine vllm") != std::string::npos);
}

TEST_CASE("serving note: sink tokens and unserved families keep a policy out of vLLM", "[policy]") {
  policy::Policy p = two_layer_policy();
  CHECK(policy::vllm_refusal(p, "jamba").find("not jamba") != std::string::npos);
  // The gated-DeltaNet hybrids are served (docs/deploy.md): a windows-only policy runs in vLLM.
  CHECK(policy::vllm_refusal(p, "qwen3_next").empty());
  CHECK(policy::vllm_refusal(p, "qwen3_5_text").empty());
  p.sink_tokens = 4;
  CHECK(policy::vllm_refusal(p, "llama").find("--sink-tokens 0") != std::string::npos);
}
