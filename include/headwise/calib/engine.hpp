#pragma once
// Whose bytes a calibration's budget counts (`--engine`): headwise's grouped cache (the default:
// the runtime, transformers' HeadwiseCache) or vLLM's allocator serving the policy through
// python/headwise_vllm (each global layer split into one attention layer per window of its heads).
//
// With vLLM (docs/deploy.md, "Calibrating for vLLM"):
//  - every head's cost at every ladder level is memory::vllm_head_bytes (the window +
//    max_num_batched_tokens rule, the block rounding at vLLM's attention block, never above full),
//    and the fixed part is what vLLM reserves for the non-global layers (memory::vllm_fixed_bytes);
//  - the walk decides with those per-head costs; then fit_to_engine fits the policy to the budget
//    in vLLM's exact reservation (memory::vllm_estimate: page unification and grouping included)
//    with solve::fit_coupled over the conditioned curves, and serves as `full` every head whose
//    window reserves no less than full;
//  - the keep rules resolve to `window` and sink tokens must be 0: what the plugin serves.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/memory/vllm_model.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::calib {

enum class ServingEngine { kHeadwise, kVllm };
// "headwise" or "vllm"; a FieldError naming `engine` otherwise.
ServingEngine parse_serving_engine(std::string_view text);
std::string_view serving_engine_name(ServingEngine engine);

// The keep rules a calibration for `engine` uses (keep_rules.hpp's resolve_keep_rules): with
// vLLM, `auto` and `window` are `window`; h2o is a FieldError naming `keep_rules` (vLLM selects no
// tokens). Sink tokens above 0 with vLLM: a FieldError naming `sink_tokens`.
std::string engine_keep_rules(const std::string& text, DistortionMeasure measure,
                              ServingEngine engine);
void check_engine_options(ServingEngine engine, const memory::MemoryOptions& memory,
                          const memory::VllmOptions& vllm);

// The bytes a budget counts, for one model and serving shape.
class EngineBytes {
 public:
  EngineBytes(const arch::ModelSpec& spec, const memory::MemoryOptions& memory,
              ServingEngine engine, const memory::VllmOptions& vllm = {});
  ServingEngine engine() const { return engine_; }
  const memory::VllmOptions& vllm() const { return vllm_; }
  const memory::MemoryOptions& memory() const { return memory_; }
  const arch::ModelSpec& spec() const { return spec_; }
  // Outside the global layers' heads.
  int64_t fixed() const;
  // One head of a global layer at a window (the knapsack's rate).
  int64_t head(const arch::LayerSpec& layer, int64_t window) const;
  HeadBytesFn head_fn() const;
  // The exact total of a policy's windows (vLLM: its reservation, padding slots included).
  int64_t total(const memory::HeadWindows& windows) const;
  // The exact total with every head at its cheapest level of `ladder` (vLLM: a level that
  // reserves at least full served as full).
  int64_t minimum(const std::vector<int64_t>& ladder) const;
  // The exact total with every head full (no policy).
  int64_t full() const;

 private:
  const arch::ModelSpec& spec_;
  memory::MemoryOptions memory_;
  ServingEngine engine_;
  memory::VllmOptions vllm_;
};

// One line when vLLM is run (or its bytes estimated) with other parameters than `policy` was
// calibrated for (its engine record: max_num_batched_tokens, mamba_cache_mode; its block_size,
// context = max_model_len, batch, dtype): the parameters that differ, both ways. nullopt when they
// agree or the policy records no engine.
std::optional<std::string> engine_parameters_notice(const policy::Policy& policy,
                                                    const memory::MemoryOptions& serving,
                                                    const memory::VllmOptions& vllm);

// Before any model work: with vLLM, the ladder must hold `full` (a window that reserves as much
// as full is served as full) and the budget must hold the cheapest policy in vLLM's reservation
// (InfeasibleFieldError naming `budget`, with that minimum and full KV's reservation). The
// headwise engine's check stays the job's own.
void refuse_budget_below_engine_minimum(const EngineBytes& bytes,
                                        const std::vector<int64_t>& ladder, int64_t budget);

// The policy's engine record (policy.yaml `engine`) for `windows`; nullopt for headwise.
std::optional<policy::EngineRecord> engine_record(const EngineBytes& bytes,
                                                  const memory::HeadWindows& windows);

struct EngineFit {
  std::map<int64_t, std::vector<int64_t>> windows;
  std::map<int64_t, std::vector<double>> expected_distortion;
  int64_t total_bytes = 0;
  int64_t heads_moved = 0;  // heads whose window the fit changed
};

// vLLM: the walk's windows fitted to `budget` in vLLM's exact reservation (see above), each head's
// distortion read from its conditioned curve. InfeasibleFieldError naming `budget` when nothing
// fits. The headwise engine returns the windows unchanged.
EngineFit fit_to_engine(const EngineBytes& bytes, const std::vector<HeadCurve>& curves,
                        const std::map<int64_t, std::vector<int64_t>>& windows,
                        const std::map<int64_t, std::vector<double>>& distortion, int64_t budget);

}  // namespace headwise::calib
