// headwise-calc mem-estimate: the exact cache bytes of a policy (or full KV / a uniform window)
// for a model, from config.json alone; with --gpu-memory, the largest context and batch that fit.
#include <spdlog/spdlog.h>

#include <iostream>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "headwise/arch/context_guard.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/calib/engine.hpp"
#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"
#include "headwise/io/checkpoint.hpp"
#include "headwise/memory/pipeline_parallel.hpp"
#include "headwise/memory/prefill_peak.hpp"
#include "headwise/memory/report.hpp"
#include "headwise/memory/tensor_parallel.hpp"
#include "headwise/policy/policy.hpp"
#include "policy_check.hpp"

namespace headwise::cli {
namespace {
namespace fs = std::filesystem;

struct MemEstimateArgs {
  CommonFlags common;
  std::string config;  // policy.yaml
  std::string model;
  bool full_kv = false;
  std::string uniform_window;
  std::string context, batch, block_size, kv_dtype, sink_tokens, state_dtype;
  std::string gpu_memory, reserve, weights_bytes;
  std::string engine, max_num_batched_tokens, max_model_len,
      mamba_cache_mode;                // --engine vllm / both
  std::string tensor_parallel_size;    // --engine vllm: per rank and over all ranks
  std::string pipeline_parallel_size;  // --engine vllm: per stage
  bool per_layer = false;
  bool prometheus = false;
  std::string prompt_tokens;  // a policy with snap heads: the prompt its prefill peak is for
};

// Prometheus label values escape backslash, double quote and newline.
std::string label_value(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

// The estimate as Prometheus exposition text (text format 0.0.4), for an exporter to serve:
// every global KV head's window (+Inf = full), the total, each component and full KV's bytes,
// all labelled with the model, the policy, the context and the batch.
std::string prometheus_text(const memory::Report& r) {
  const auto& e = r.estimate;
  const std::string common =
      fmt::format("model=\"{}\",policy=\"{}\",context=\"{}\",batch=\"{}\"", label_value(r.model),
                  label_value(r.policy_label), e.options.context, e.options.batch);
  std::string out;
  const auto family = [&](std::string_view name, std::string_view help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n", name, help, name);
  };
  family("headwise_kv_window_size",
         "Tokens a global-attention KV head keeps (+Inf: full, the whole context)");
  for (const auto& l : e.layers) {
    if (!l.kv_head_windows) continue;
    for (size_t h = 0; h < l.kv_head_windows->size(); ++h) {
      const int64_t w = (*l.kv_head_windows)[h];
      out += fmt::format("headwise_kv_window_size{{{},layer=\"{}\",head=\"{}\"}} {}\n", common,
                         l.layer_id, h,
                         w == memory::kFullWindow ? std::string("+Inf") : std::to_string(w));
    }
  }
  family("headwise_cache_bytes",
         "Exact bytes of every KV buffer and recurrent state the policy's cache holds");
  out += fmt::format("headwise_cache_bytes{{{}}} {}\n", common, e.total_bytes);
  family("headwise_cache_component_bytes", "The cache bytes by component");
  const auto& c = e.components;
  const std::pair<const char*, int64_t> components[] = {{"global_kv", c.global_kv_bytes},
                                                        {"local_kv", c.local_kv_bytes},
                                                        {"linear_state", c.linear_state_bytes},
                                                        {"ssm_state", c.ssm_state_bytes},
                                                        {"other_state", c.other_state_bytes}};
  for (const auto& [name, bytes] : components) {
    out += fmt::format("headwise_cache_component_bytes{{{},component=\"{}\"}} {}\n", common, name,
                       bytes);
  }
  if (c.selection_state_bytes > 0) {
    out += fmt::format("headwise_cache_component_bytes{{{},component=\"selection_state\"}} {}\n",
                       common, c.selection_state_bytes);
  }
  family("headwise_full_kv_cache_bytes",
         "The same cache with every global KV head full, for comparison");
  out += fmt::format("headwise_full_kv_cache_bytes{{{}}} {}\n", common, r.full_kv_total_bytes);
  return out;
}

// A policy with snap heads: its steady bytes, its prefill peak under both schedules and what a
// disaggregated deployment holds and moves (memory/prefill_peak.hpp).
nlohmann::json prefill_json(const memory::PrefillPeak& p) {
  return {{"prompt_tokens", p.prompt_tokens},
          {"steady_bytes", p.steady_bytes},
          {"staging_bytes_per_token", p.staging_bytes_per_token},
          {"whole_prompt_peak_bytes", p.whole_prompt_peak_bytes},
          {"layer_by_layer_peak_bytes", p.layer_by_layer_peak_bytes},
          {"decode_node_bytes", p.decode_node_bytes},
          {"transfer_bytes_per_request", p.transfer_bytes_per_request}};
}

std::string prefill_table(const memory::PrefillPeak& p) {
  const auto ratio = [&](int64_t b) {
    return static_cast<double>(b) / static_cast<double>(std::max<int64_t>(p.steady_bytes, 1));
  };
  return fmt::format(
      "snap heads choose at the prompt's end; prefill of a {}-token prompt:\n"
      "  steady decode bytes (the budget)      {:>16}\n"
      "  prefill peak, whole-prompt staging    {:>16}  {:.2f}x\n"
      "  prefill peak, layer by layer          {:>16}  {:.2f}x\n"
      "  disaggregated: decode node holds      {:>16}\n"
      "  disaggregated: transfer per request   {:>16}\n",
      p.prompt_tokens, p.steady_bytes, p.whole_prompt_peak_bytes, ratio(p.whole_prompt_peak_bytes),
      p.layer_by_layer_peak_bytes, ratio(p.layer_by_layer_peak_bytes), p.decode_node_bytes,
      p.transfer_bytes_per_request);
}

// The model folder: --model wins; else the policy's model_path (relative to the policy file).
fs::path model_dir_of(const MemEstimateArgs& a, const policy::Policy* p) {
  if (!a.model.empty()) return io::resolve_model_dir(a.model);
  if (p == nullptr || p->model_path.empty()) {
    throw_input_error("{}: model_path is empty; pass --model DIR", a.config);
  }
  fs::path path(p->model_path);
  if (path.is_relative()) path = fs::path(a.config).parent_path() / path;
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    throw_input_error("{}: model_path {} is not a folder; pass --model DIR", a.config,
                      path.string());
  return path;
}

// Applies --context ... over `o` (the policy's values or defaults).
void apply_overrides(const MemEstimateArgs& a, memory::MemoryOptions& o) {
  if (!a.context.empty()) o.context = parse_token_count(a.context, "--context");
  // vLLM's max_model_len is our context: one setting under two names.
  if (!a.max_model_len.empty()) {
    const int64_t len = parse_token_count(a.max_model_len, "--max-model-len");
    if (!a.context.empty() && len != o.context) {
      throw_input_error(
          "--max-model-len: {} conflicts with --context {}; they are the same setting, give one",
          len, o.context);
    }
    o.context = len;
  }
  if (!a.batch.empty()) o.batch = parse_token_count(a.batch, "--batch");
  if (!a.block_size.empty()) o.block_size = parse_token_count(a.block_size, "--block-size");
  if (!a.sink_tokens.empty()) {
    o.sink_tokens = a.sink_tokens == "0" ? 0 : parse_token_count(a.sink_tokens, "--sink-tokens");
  }
  if (!a.kv_dtype.empty()) o.kv_dtype = parse_dtype(a.kv_dtype, "--kv-dtype");
  if (a.state_dtype == "native") {
    o.state_dtype.reset();
  } else if (!a.state_dtype.empty()) {
    o.state_dtype = parse_dtype(a.state_dtype, "--state-dtype");
  }
  if (o.context <= 0)
    throw_input_error(
        "--context: required with --model (e.g. --context 128k or --max-model-len 128k)");
  memory::validate_options(o);
}

memory::GpuFit gpu_fit(const MemEstimateArgs& a, const arch::ModelSpec& spec,
                       const memory::HeadWindows& windows, const std::set<int64_t>& selecting,
                       const memory::MemoryOptions& o, std::optional<int64_t> weights) {
  memory::GpuFit g;
  g.gpu_memory_bytes = parse_byte_size(a.gpu_memory, "--gpu-memory");
  g.reserve_bytes = a.reserve.empty() ? 0 : parse_byte_size(a.reserve, "--reserve");
  if (!a.weights_bytes.empty()) weights = parse_byte_size(a.weights_bytes, "--weights-bytes");
  if (!weights) {
    throw_input_error(
        "--gpu-memory: the model folder has no safetensors, so the weight bytes are unknown; pass "
        "--weights-bytes SIZE");
  }
  g.weights_bytes = *weights;
  g.cache_budget_bytes = g.gpu_memory_bytes - g.weights_bytes - g.reserve_bytes;
  g.full_kv = memory::capacity(spec, memory::full_kv_windows(spec), o, g.cache_budget_bytes);
  g.policy = memory::capacity(spec, windows, o, g.cache_budget_bytes, memory::kContextSearchLimit,
                              selecting);
  return g;
}

// vLLM's parameters: the flags, else those the policy was calibrated with (--engine vllm).
memory::VllmOptions vllm_options(const MemEstimateArgs& a, const policy::Policy* p) {
  memory::VllmOptions v;
  if (p != nullptr && p->engine) {
    v.max_num_batched_tokens = p->engine->max_num_batched_tokens;
    v.mamba_cache_mode = memory::parse_mamba_cache_mode(p->engine->mamba_cache_mode);
  }
  if (!a.max_num_batched_tokens.empty()) {
    v.max_num_batched_tokens =
        parse_token_count(a.max_num_batched_tokens, "--max-num-batched-tokens");
  }
  if (!a.mamba_cache_mode.empty())
    v.mamba_cache_mode = memory::parse_mamba_cache_mode(a.mamba_cache_mode);
  memory::validate_vllm_options(v);
  return v;
}

int64_t parallel_size(const std::string& text, const char* flag) {
  if (text.empty()) return 1;
  const int64_t n = parse_token_count(text, flag);
  if (n < 1) throw_input_error("{}: must be positive, got {}", flag, n);
  return n;
}

// What vLLM's allocator reserves for the same windows; its capacity under the same budget.
// Under tensor parallelism (--tensor-parallel-size N): what one rank reserves, every rank the
// same, for the rank's shard of the model and of the windows (memory/tensor_parallel.hpp).
memory::VllmReport vllm_report(const MemEstimateArgs& a, const arch::ModelSpec& full_spec,
                               const memory::HeadWindows& all_windows,
                               const memory::MemoryOptions& o,
                               const std::optional<memory::GpuFit>& gpu, const policy::Policy* p) {
  memory::VllmOptions v = vllm_options(a, p);
  if (p != nullptr) {
    if (const auto notice = calib::engine_parameters_notice(*p, o, v))
      spdlog::warn("{}: {}", a.config, *notice);
  }
  const int64_t tp = parallel_size(a.tensor_parallel_size, "--tensor-parallel-size");
  const int64_t pp = parallel_size(a.pipeline_parallel_size, "--pipeline-parallel-size");
  // Under pipeline parallelism vLLM keeps pipeline_parallel_size batches in flight
  // (max_concurrent_batches without async scheduling, which its V1 runner turns off under PP).
  v.in_flight_batches = pp;
  if (tp > 1) {
    if (auto bad = memory::first_unshardable_layer(all_windows, tp)) {
      throw_input_error(
          "--tensor-parallel-size {}: {} layer {}: {}; vLLM builds one KV cache layout for every "
          "rank, so each rank's shard must hold the same windows (calibrate with "
          "--tensor-parallel-size {})",
          tp, a.config.empty() ? std::string("the windows of") : a.config, bad->first, bad->second,
          tp);
    }
  }
  const arch::ModelSpec spec = memory::shard_model_spec(full_spec, tp);
  const memory::HeadWindows windows = memory::shard_windows(all_windows, tp, 0);
  memory::VllmReport out;
  out.tensor_parallel_size = tp;
  out.pipeline_parallel_size = pp;
  out.estimate = memory::vllm_estimate(spec, windows, o, v);
  if (pp > 1) {
    out.stages = memory::vllm_stages(out.estimate, pp);
    out.full_kv_stages =
        memory::vllm_stages(memory::vllm_estimate(spec, memory::full_kv_windows(spec), o, v), pp);
  }
  out.full_kv_total_bytes =
      memory::vllm_estimate(spec, memory::full_kv_windows(spec), o, v).total_bytes;
  if (gpu && pp > 1) {
    throw_input_error(
        "--gpu-memory with --pipeline-parallel-size: a stage's share of the weights is not "
        "modelled; mem-estimate states each stage's reservation, size vLLM's pool per stage");
  }
  if (gpu) {
    out.gpu_full_kv =
        memory::vllm_capacity(spec, memory::full_kv_windows(spec), o, v, gpu->cache_budget_bytes);
    out.gpu_policy = memory::vllm_capacity(spec, windows, o, v, gpu->cache_budget_bytes);
  }
  return out;
}

void run(const MemEstimateArgs& a) {
  apply_logging(a.common);
  const int modes = (!a.config.empty()) + a.full_kv + (!a.uniform_window.empty());
  if (modes != 1)
    throw_input_error(
        "mem-estimate: give exactly one of --config POLICY, --full-kv, --uniform-window W");
  if (a.config.empty() && a.model.empty())
    throw_input_error("--model: required with --full-kv / --uniform-window");
  if (a.prometheus && a.common.json)
    throw_input_error("--prometheus: give either --prometheus or --json");
  if (a.prometheus && !a.engine.empty() && a.engine != "headwise") {
    throw_input_error("--prometheus: reports headwise's cache only (drop --engine {})", a.engine);
  }

  std::optional<policy::Policy> pol;
  if (!a.config.empty()) pol = policy::read_policy(a.config);
  const fs::path dir = model_dir_of(a, pol ? &*pol : nullptr);
  const arch::ModelSpec spec = arch::load_model_spec(dir);

  memory::Report report;
  // A policy calibrated for vLLM (its `engine` record) is reported in vLLM's bytes by default.
  report.engine = !a.engine.empty()                     ? memory::parse_engine(a.engine)
                  : pol && pol->engine && !a.prometheus ? memory::Engine::kVllm
                                                        : memory::Engine::kHeadwise;
  for (const auto& [flag, value] : {std::pair<const char*, const std::string*>{
                                        "--tensor-parallel-size", &a.tensor_parallel_size},
                                    {"--pipeline-parallel-size", &a.pipeline_parallel_size}}) {
    if (!value->empty() && report.engine != memory::Engine::kVllm) {
      throw_input_error("{}: only with --engine vllm (headwise's runtime runs on one device)",
                        flag);
    }
  }
  const int64_t tp = parallel_size(a.tensor_parallel_size, "--tensor-parallel-size");
  if (report.engine == memory::Engine::kHeadwise &&
      !(a.max_num_batched_tokens.empty() && a.mamba_cache_mode.empty())) {
    throw_input_error(
        "--max-num-batched-tokens/--mamba-cache-mode: only with --engine vllm or both");
  }
  report.model = pol && !pol->model_name.empty() ? pol->model_name : dir.filename().string();
  memory::MemoryOptions o;
  memory::HeadWindows windows;
  std::set<int64_t>
      selecting;  // layers whose heads select tokens (their bookkeeping is cache memory)
  if (pol) {
    // A hand-written policy carries no fingerprint: mem-estimate needs only the config's shapes.
    if (pol->fingerprint.config_sha256.empty()) {
      policy::validate_against_model(*pol, spec, a.config);
    } else {
      check_policy_matches(*pol, dir, spec, a.config, "--config");
    }
    o = pol->memory_options();
    windows = pol->head_windows();
    selecting = pol->selecting_layers();
    if (!pol->heads_with_rule(policy::KeepRule::kSnap).empty() &&
        report.engine != memory::Engine::kHeadwise) {
      throw_input_error(
          "--engine {}: {} has snap heads, which compact their pages after prefill and vLLM "
          "cannot; serve it with headwise's runtime decoder (docs/keep-rules.md)",
          a.engine, a.config);
    }
    if (!selecting.empty() && report.engine != memory::Engine::kHeadwise) {
      throw_input_error(
          "--engine {}: {} has h2o heads (kv_head_rules), and vLLM's cache has no token selection "
          "(calibrate with --keep-rules window for a policy vLLM can serve)",
          a.engine, a.config);
    }
    report.policy_label = "policy " + fs::path(a.config).filename().string();
  } else {
    o.kv_dtype = (spec.dtype == DType::kFloat16 || spec.dtype == DType::kFloat32)
                     ? spec.dtype
                     : DType::kBFloat16;
    if (a.full_kv) {
      windows = memory::full_kv_windows(spec);
      report.policy_label = "full KV";
    } else {
      const int64_t w = parse_token_count(a.uniform_window, "--uniform-window");
      windows = memory::uniform_windows(spec, w);
      report.policy_label = "uniform window " + std::to_string(w);
    }
  }
  apply_overrides(a, o);
  if (const auto warning =
          arch::check_context(spec, o.context, "--context", (dir / "config.json").string())) {
    spdlog::warn("{}", *warning);
  }
  report.estimate = memory::estimate(spec, windows, o, selecting);
  report.full_kv_total_bytes = memory::full_kv_bytes(spec, o);
  const auto checkpoint = io::Checkpoint::open(dir, /*allow_missing_weights=*/true);
  if (checkpoint->has_weights()) report.weights_bytes = checkpoint->weight_bytes();
  if (!a.gpu_memory.empty()) {
    // Under tensor parallelism --gpu-memory is each GPU's, and a rank holds its share of the
    // weights: --weights-bytes (the rank's, as vLLM logs it), else the checkpoint's / tp.
    std::optional<int64_t> weights = report.weights_bytes;
    if (tp > 1 && weights && a.weights_bytes.empty()) {
      weights = (*weights + tp - 1) / tp;
      report.weights_split_evenly = true;
    }
    report.gpu = gpu_fit(a, spec, windows, selecting, o, weights);
  } else if (!a.reserve.empty() || !a.weights_bytes.empty())
    throw_input_error("--reserve/--weights-bytes: only with --gpu-memory");
  if (report.engine != memory::Engine::kHeadwise)
    report.vllm = vllm_report(a, spec, windows, o, report.gpu, pol ? &*pol : nullptr);
  const memory::SnapHeads snap =
      pol ? pol->heads_with_rule(policy::KeepRule::kSnap) : memory::SnapHeads{};
  if (snap.empty() && !a.prompt_tokens.empty())
    throw_input_error("--prompt-tokens: only with a policy that has snap heads (--config)");
  std::optional<memory::PrefillPeak> peak;
  if (!snap.empty()) {
    const int64_t prompt =
        a.prompt_tokens.empty() ? o.context : parse_token_count(a.prompt_tokens, "--prompt-tokens");
    peak = memory::prefill_peak(spec, windows, o, selecting, snap, prompt);
  }
  // Everything is computed: only now print, so an error never leaves half a report.
  if (a.prometheus) {
    std::cout << prometheus_text(report);
  } else if (a.common.json) {
    nlohmann::json j = memory::report_json(report);
    if (peak) j["prefill"] = prefill_json(*peak);
    std::cout << j.dump(1) << "\n";
  } else {
    std::cout << memory::report_table(report, a.per_layer);
    if (peak) std::cout << prefill_table(*peak);
  }
}

void setup(CLI::App& root) {
  auto args = std::make_shared<MemEstimateArgs>();
  CLI::App* app = root.add_subcommand("mem-estimate",
                                      "Exact cache bytes of a policy (or full KV / a uniform "
                                      "window) for a model, from config.json alone.\n"
                                      "Sizes take k/m/g/t suffixes in powers of 1024: 128k tokens "
                                      "= 131072, 80g = 80 GiB = 85899345920 bytes.");
  app->add_option("--config", args->config,
                  "policy.yaml (schema headwise/policy/v1); its model_path names the model");
  app->add_option("--model", args->model,
                  "Model folder (config.json; safetensors optional) or cached HF repo id");
  app->add_flag("--full-kv", args->full_kv, "Every global KV head keeps the full context");
  app->add_option("--uniform-window", args->uniform_window,
                  "Every global KV head keeps this many tokens");
  app->add_option("--context", args->context, "Context length in tokens (e.g. 128k = 131072)");
  app->add_option("--batch", args->batch, "Concurrent sequences (default 1 or the policy's)");
  app->add_option("--block-size", args->block_size,
                  "Paged-cache block in tokens; 1 = unpaged (default 16)");
  app->add_option("--kv-dtype", args->kv_dtype,
                  "KV element type: bf16, fp16, fp32, fp8 (default: model dtype)");
  app->add_option("--sink-tokens", args->sink_tokens,
                  "Sink tokens every windowed head keeps (default 0)");
  app->add_option(
      "--state-dtype", args->state_dtype,
      "Override the dtype of every recurrent/conv state (default: the policy's state_dtype, else "
      "as the "
      "architecture keeps them; native: as the architecture keeps them); "
      "with --engine vllm: its mamba_ssm_cache_dtype (conv states stay at the model dtype)");
  app->add_option("--gpu-memory", args->gpu_memory,
                  "GPU memory (e.g. 80g = 80 GiB): report the largest context and batch that fit");
  app->add_option("--reserve", args->reserve,
                  "Bytes kept free for activations/runtime with --gpu-memory (e.g. 2g)");
  app->add_option("--weights-bytes", args->weights_bytes,
                  "Weight bytes when the folder has no safetensors (e.g. 54g)");
  app->add_option(
      "--engine", args->engine,
      "Whose allocation to report: headwise (default: the grouped cache), vllm (vLLM's allocator, "
      "rules of the release pinned in versions.env) or both side by side");
  app->add_option("--max-model-len", args->max_model_len,
                  "vLLM's name for --context (give either; equal if both)");
  app->add_option("--max-num-batched-tokens", args->max_num_batched_tokens,
                  "vLLM's max_num_batched_tokens (default 8192: vllm serve on a >= 70 GiB GPU)");
  app->add_option("--tensor-parallel-size", args->tensor_parallel_size,
                  "vLLM's tensor_parallel_size (--engine vllm): what each rank reserves (its shard "
                  "of every layer's heads and states) and all ranks together; the policy's "
                  "windows must shard evenly. With --gpu-memory: each GPU's memory, holding the "
                  "rank's --weights-bytes (default: the checkpoint's / N)");
  app->add_option("--pipeline-parallel-size", args->pipeline_parallel_size,
                  "vLLM's pipeline_parallel_size (--engine vllm): which layers each stage holds "
                  "(vLLM's get_pp_indices) and what each stage reserves, with that many batches "
                  "of --max-num-batched-tokens in flight");
  app->add_option("--mamba-cache-mode", args->mamba_cache_mode,
                  "vLLM's mamba_cache_mode: none (default), align or all (prefix caching of "
                  "Mamba/linear states)");
  app->add_option("--prompt-tokens", args->prompt_tokens,
                  "A policy with snap heads: the prompt length its prefill peak is stated for "
                  "(default: the context)");
  app->add_flag("--per-layer", args->per_layer, "List every layer in the table");
  app->add_flag("--prometheus", args->prometheus,
                "Print Prometheus exposition text (headwise_kv_window_size{layer,head}, "
                "headwise_cache_bytes, "
                "headwise_cache_component_bytes{component}, headwise_full_kv_cache_bytes; model, "
                "policy, context "
                "and batch as labels) for an exporter to serve");
  add_common_flags(app, args->common, /*with_json=*/true);
  app->callback([args] { run(*args); });
}

const RegisterCommand kRegister("mem-estimate", setup);

}  // namespace
}  // namespace headwise::cli
