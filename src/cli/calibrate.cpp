// The main job: `headwise-calc --model DIR --context 160k --budget 48g [-o policy.yaml]`.
// Calibrates per-KV-head windows with SeqCalib and writes the policy, a JSON report and an
// SVG heat map. All outputs are written atomically; nothing is written on failure.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>

#include "headwise/arch/model.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/calibration_data.hpp"
#include "headwise/calib/memory_plan.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/core/units.hpp"
#include "headwise/core/window.hpp"
#include "headwise/io/checkpoint.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/policy/policy.hpp"
#include "headwise/report/calib_report.hpp"

namespace headwise::cli {
namespace {
namespace fs = std::filesystem;

struct CalibrateArgs {
  std::string model;
  std::string context;
  std::string budget;
  std::string output = "policy.yaml";
  std::string windows = "1k,4k,16k,64k,full";
  std::string calib;
  int64_t samples = 8;
  std::string seq_len = "2k";
  int64_t block_size = 16;
  int64_t batch = 1;
  int64_t sink_tokens = 0;
  std::string kv_dtype;
  uint64_t seed = 0;
  std::string device = "cpu";
  std::string dtype;
  std::string report;
  std::string plot;
  int64_t micro_batch = 0;
  int64_t probe_samples = 0;
  int64_t attention_chunk = 512;
  std::string activations = "auto";
  bool no_conditioning = false;
  CommonFlags flags;
};

calib::ActivationPlacement parse_placement(const std::string& text) {
  if (text == "auto") return calib::ActivationPlacement::kAuto;
  if (text == "device") return calib::ActivationPlacement::kDevice;
  if (text == "host") return calib::ActivationPlacement::kHost;
  throw_input_error("--activations: '{}' is not one of auto, device, host", text);
}

std::string model_name_of(const fs::path& dir, const arch::ModelSpec& spec) {
  const fs::path clean = dir.filename().empty() ? dir.parent_path() : dir;
  return clean.filename().string().empty() ? spec.model_type : clean.filename().string();
}

// model_path is read relative to the policy's own folder (mem-estimate, regen), so policies
// committed next to a model keep working from any checkout.
std::string model_path_for(const fs::path& model_dir, const std::string& policy_path) {
  const fs::path policy_dir = fs::absolute(fs::path(policy_path)).parent_path();
  return fs::absolute(model_dir).lexically_normal().lexically_relative(policy_dir.lexically_normal()).string();
}

void check_outputs_writable(const CalibrateArgs& args) {
  for (const auto& path : {args.output, args.report, args.plot}) {
    if (path.empty()) continue;
    const fs::path parent = fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
    if (!fs::is_directory(parent)) throw_input_error("{}: output folder {} does not exist", path, parent.string());
  }
}

void refuse_if_it_cannot_fit(const calib::MemoryPlan& plan) {
  spdlog::info("calibration memory: {}", plan.describe());
  if (plan.available_bytes && plan.device_peak_bytes() > *plan.available_bytes) {
    throw InfeasibleError(fmt::format("calibration needs about {} but only {} is available; lower --samples, --seq-len or "
                                      "--micro-batch, or use --activations host",
                                      format_bytes(plan.device_peak_bytes()), format_bytes(*plan.available_bytes)));
  }
}

// A window at least as long as the calibration sequences truncates nothing there, so its
// measured distortion is 0 whatever it does at the deployed context. Say so plainly.
void warn_about_unmeasurable_levels(const measure::WindowLadder& ladder, int64_t seq_len, int64_t context) {
  std::vector<std::string> blind;
  for (int64_t w : ladder.levels) {
    if (w != kFullWindow && w >= seq_len && w < context) blind.push_back(format_tokens(w));
  }
  if (!blind.empty()) {
    spdlog::warn("window levels {} are >= --seq-len {}: calibration cannot tell them from full KV (their measured "
                 "distortion is 0); calibrate with longer sequences to rank them",
                 fmt::format("{}", fmt::join(blind, ",")), seq_len);
  }
}

void run_calibrate(const CalibrateArgs& args) {
  apply_logging(args.flags);
  check_outputs_writable(args);
  const fs::path dir = io::resolve_model_dir(args.model);
  const arch::ModelSpec spec = arch::load_model_spec(dir);

  memory::MemoryOptions mem;
  mem.context = parse_token_count(args.context, "--context");
  mem.batch = args.batch;
  mem.block_size = args.block_size;
  mem.sink_tokens = args.sink_tokens;
  mem.kv_dtype = args.kv_dtype.empty() ? spec.dtype : parse_dtype(args.kv_dtype, "--kv-dtype");
  memory::validate_options(mem);
  const int64_t budget = parse_byte_size(args.budget, "--budget");
  const auto ladder = measure::parse_window_ladder(args.windows, "--windows");
  const int64_t seq_len = parse_token_count(args.seq_len, "--seq-len");
  if (args.samples <= 0) throw_input_error("--samples must be positive, got {}", args.samples);

  // Feasibility before any heavy work: fixed bytes plus the smallest level everywhere.
  const int64_t fixed = memory::fixed_bytes(spec, mem);
  int64_t minimum = fixed;
  for (int64_t id : spec.global_layer_ids()) {
    const auto& att = *spec.layer(id).attention;
    minimum += att.num_kv_heads * memory::head_bytes(att, ladder.levels.front(), mem);
  }
  if (budget < minimum) {
    throw InfeasibleError(fmt::format("--budget {} is below the minimum {} ({} bytes: {} fixed for non-global layers + every "
                                      "global KV head at {} tokens) at context {}",
                                      format_bytes(budget), format_bytes(minimum), minimum, format_bytes(fixed),
                                      ladder.levels.front(), mem.context));
  }

  arch::ModelOptions model_options;
  model_options.device = args.device;
  model_options.attention_chunk = args.attention_chunk;
  if (!args.dtype.empty()) model_options.compute_dtype = parse_dtype(args.dtype, "--dtype");
  auto model = arch::load_model(dir, model_options);

  const calib::CalibrationData data = calib::load_calibration_data(args.calib, dir, spec.vocab_size, args.samples, seq_len,
                                                                   args.seed);
  const int64_t micro_batch = args.micro_batch > 0 ? args.micro_batch : static_cast<int64_t>(data.sequences.size());
  calib::CalibrationShape shape{static_cast<int64_t>(data.sequences.size()), seq_len, micro_batch, args.attention_chunk,
                                static_cast<int64_t>(ladder.size()), static_cast<int64_t>(c10::elementSize(model->dtype()))};
  const bool cpu = model->device().is_cpu();
  refuse_if_it_cannot_fit(calib::plan_calibration_memory(
      spec, model->checkpoint(), shape, cpu || args.activations != "host",
      cpu ? calib::available_host_bytes() : calib::free_device_bytes(model->device())));
  spdlog::info("calibrating {} ({} layers, {} global) on {} sequences x {} tokens, ladder {}, budget {} ({} fixed)",
               dir.string(), spec.num_layers(), spec.global_layer_ids().size(), data.sequences.size(), seq_len,
               ladder.to_string(), format_bytes(budget), format_bytes(fixed));

  warn_about_unmeasurable_levels(ladder, seq_len, mem.context);

  calib::SeqCalibOptions options;
  options.ladder = ladder;
  options.global_budget_bytes = budget - fixed;
  options.sink_tokens = args.sink_tokens;
  options.head_bytes = [&mem](const arch::LayerSpec& layer, int64_t window) {
    return memory::head_bytes(*layer.attention, window, mem);
  };
  options.micro_batch = micro_batch;
  options.probe_samples = args.probe_samples;
  options.conditioned = !args.no_conditioning;
  options.activations = parse_placement(args.activations);
  const calib::SeqCalibResult result = calib::run_seqcalib(*model, data.sequences, options);

  policy::Policy policy;
  policy.model_name = model_name_of(dir, spec);
  policy.model_path = model_path_for(dir, args.output);
  policy.fingerprint = policy::fingerprint_model(dir);
  policy.budget_gb = static_cast<double>(budget) / static_cast<double>(int64_t{1} << 30);
  policy.context = mem.context;
  policy.batch = mem.batch;
  policy.dtype = mem.kv_dtype;
  policy.block_size = mem.block_size;
  policy.sink_tokens = mem.sink_tokens;
  policy.window_levels = ladder.levels;
  policy.calibration = {
      {"tool", fmt::format("headwise-calc {}", HEADWISE_VERSION)},
      {"method", options.conditioned ? "seqcalib" : "unconditioned"},
      {"distortion_measure", "block_output_relative_mse"},
      {"dataset", data.description},
      {"dataset_sha256", data.sha256},
      {"samples", static_cast<int64_t>(data.sequences.size())},
      {"seq_len", seq_len},
      {"seed", args.seed},
      {"probe_samples", args.probe_samples > 0 ? args.probe_samples : static_cast<int64_t>(data.sequences.size())},
  };
  for (const auto& [layer_id, windows] : result.windows) {
    policy.per_layer_policies.push_back({layer_id, windows, result.expected_distortion.at(layer_id)});
  }
  policy::fill_memory(policy, spec);
  HEADWISE_CHECK(policy.memory.total_bytes <= budget, "policy total {} exceeds budget {}", policy.memory.total_bytes, budget);

  report::ReportContext context{policy.model_name, mem.context, budget, fixed, policy.memory.total_bytes,
                                policy.memory.full_kv_total_bytes, ladder, policy.calibration};
  // Render everything first, then write: a failure leaves no partial set of outputs.
  const std::string report_text = args.report.empty() ? "" : report::calibration_report(result, context).dump(2) + "\n";
  const std::string svg = args.plot.empty() ? "" : report::window_heatmap_svg(spec, result.windows, ladder,
      fmt::format("{}: KV-head windows at {} tokens, {} budget", policy.model_name, format_tokens(mem.context),
                  format_bytes(budget)));
  policy::write_policy(args.output, policy);
  if (!args.report.empty()) write_file_atomically(args.report, report_text);
  if (!args.plot.empty()) write_file_atomically(args.plot, svg);

  spdlog::info("policy: {} ({} of {} budget; full KV would need {}), calibrated in {:.1f}s", args.output,
               format_bytes(policy.memory.total_bytes), format_bytes(budget),
               format_bytes(policy.memory.full_kv_total_bytes), result.total_seconds);
  if (!args.report.empty()) spdlog::info("report: {}", args.report);
  if (!args.plot.empty()) spdlog::info("heat map: {}", args.plot);
  if (args.flags.json) {
    std::cout << nlohmann::json{{"policy", args.output},
                                {"total_bytes", policy.memory.total_bytes},
                                {"budget_bytes", budget},
                                {"full_kv_total_bytes", policy.memory.full_kv_total_bytes},
                                {"seconds", result.total_seconds}}
                     .dump()
              << "\n";
  }
}

const RegisterCommand kRegister{"calibrate", [](CLI::App& root) {
  static CalibrateArgs args;
  root.add_option("--model", args.model, "Model folder (config.json + safetensors) or cached HF repo id");
  root.add_option("--context", args.context, "Context length to serve, tokens (k = 1024: 160k = 163840)");
  root.add_option("--budget", args.budget, "Cache budget for the whole request batch (g = GiB: 48g)");
  root.add_option("-o,--output", args.output, "Policy file to write")->capture_default_str();
  root.add_option("--windows", args.windows, "Window ladder, ascending; 'full' = untruncated")->capture_default_str();
  root.add_option("--calib", args.calib, "Calibration JSONL ({\"text\": ...} or {\"input_ids\": [...]}); default: built-in "
                                         "synthetic retrieval set");
  root.add_option("--samples", args.samples, "Calibration sequences")->capture_default_str();
  root.add_option("--seq-len", args.seq_len, "Tokens per calibration sequence")->capture_default_str();
  root.add_option("--block-size", args.block_size, "Paged-cache block in tokens (1 = unpaged)")->capture_default_str();
  root.add_option("--batch", args.batch, "Sequences served at once")->capture_default_str();
  root.add_option("--sink-tokens", args.sink_tokens, "First tokens every windowed head keeps")->capture_default_str();
  root.add_option("--kv-dtype", args.kv_dtype, "KV cache dtype (default: the checkpoint's)");
  root.add_option("--seed", args.seed, "Seed for the calibration data")->capture_default_str();
  root.add_option("--device", args.device, "cpu, cuda or cuda:N")->capture_default_str();
  root.add_option("--dtype", args.dtype, "Compute dtype (default: float32 on CPU, the checkpoint's on CUDA)");
  root.add_option("--report", args.report, "JSON report: curves, lambdas, timings, peak memory");
  root.add_option("--plot", args.plot, "SVG heat map of layers x KV heads → window");
  root.add_option("--micro-batch", args.micro_batch, "Sequences per layer call (default: all)");
  root.add_option("--probe-samples", args.probe_samples, "Sequences for the full-KV probe pass (default: all)");
  root.add_option("--attention-chunk", args.attention_chunk, "Queries per attention chunk")->capture_default_str();
  root.add_option("--activations", args.activations, "Where calibration activations live: auto, device, host")
      ->capture_default_str();
  root.add_flag("--no-conditioning", args.no_conditioning,
                "Decide from curves measured with full KV below (the ablation baseline)");
  add_common_flags(&root, args.flags, /*with_json=*/true);
  root.callback([&root] {
    if (!root.get_subcommands().empty()) return;
    if (args.model.empty() && args.context.empty() && args.budget.empty()) throw CLI::CallForHelp();
    for (const auto& [flag, value] : {std::pair{"--model", &args.model}, {"--context", &args.context}, {"--budget", &args.budget}}) {
      if (value->empty()) throw_input_error("{} is required (see --help)", flag);
    }
    run_calibrate(args);
  });
}};

}  // namespace
}  // namespace headwise::cli
