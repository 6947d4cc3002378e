// The main job: `headwise-calc --model DIR --context 160k --budget 48g [-o policy.yaml]`.
// Calibrates per-KV-head windows with SeqCalib (calib/calibration_job.cpp, shared with `regen`) and
// writes the policy, a JSON report and an SVG heat map. All outputs are written atomically;
// nothing is written on failure. A checkpoint next to the policy (<output>.ckpt.json) is
// rewritten after each global layer so `--resume` can continue a killed run; it is deleted
// once the policy is written.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <iostream>

#include "calibration_options.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/calib/calibration_job.hpp"
#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/core/units.hpp"
#include "headwise/dist/collective.hpp"
#include "headwise/io/checkpoint.hpp"
#include "headwise/policy/serving.hpp"
#include "headwise/report/calib_report.hpp"

namespace headwise::cli {
namespace {
namespace fs = std::filesystem;

struct CalibrateArgs {
  calib::CalibrationRequest request;
  std::string output = "policy.yaml";
  std::string report;
  std::string plot;
  bool resume = false;
  dist::LaunchFlags launch;
  CommonFlags flags;
};

void check_outputs_writable(const CalibrateArgs& args) {
  for (const auto& path : {args.output, args.report, args.plot}) {
    if (path.empty()) continue;
    const fs::path parent =
        fs::path(path).has_parent_path() ? fs::path(path).parent_path() : fs::path(".");
    if (!fs::is_directory(parent))
      throw_input_error("{}: output folder {} does not exist", path, parent.string());
  }
}

// Ranks other than 0 say only what goes wrong (unless --verbose), each line naming the rank.
void apply_rank_logging(const dist::LaunchConfig& launch, const CommonFlags& flags) {
  if (launch.world_size == 1) return;
  spdlog::set_pattern(fmt::format("[%H:%M:%S.%e] [rank {}] [%^%l%$] %v", launch.rank));
  if (launch.rank != 0 && !flags.verbose) spdlog::set_level(spdlog::level::warn);
}

// Runs the job as one rank; a failure is told to the other ranks before it propagates, so they
// stop instead of waiting for this one.
calib::CalibrationOutcome run_as_rank(calib::CalibrationJob& job, calib::RunControl control,
                                      dist::Collective* world, const dist::LaunchConfig& launch) {
  control.collective = world;
  control.local_rank = launch.local_rank;
  try {
    return job.run(control);
  } catch (const std::exception& e) {
    if (world != nullptr) world->abort(e.what());
    throw;
  }
}

void run_calibrate(const CalibrateArgs& args) {
  apply_logging(args.flags);
  const dist::LaunchConfig launch = dist::launch_config(args.launch);
  apply_rank_logging(launch, args.flags);
  check_outputs_writable(args);
  const calib::CalibrationOptions options = calibration_options(args.request);
  calib::CalibrationJob job(options, args.output);
  const std::unique_ptr<dist::Collective> world = dist::connect(launch);
  calib::RunControl control;
  control.checkpoint = calib::checkpoint_path_for(args.output);
  control.resume = args.resume;
  const calib::CalibrationOutcome out = run_as_rank(job, control, world.get(), launch);
  const policy::Policy& policy = out.policy;
  const int64_t budget = options.budget;
  if (launch.rank != 0) {  // every rank holds the same policy; rank 0 writes it
    world->finish();
    return;
  }

  // Everything is rendered; write it all, then drop the checkpoint (the run is complete).
  write_file_atomically(args.output, out.policy_yaml);
  if (!args.report.empty())
    write_file_atomically(args.report, report::calibration_report(out).dump(2) + "\n");
  if (!args.plot.empty()) write_file_atomically(args.plot, report::calibration_heatmap_svg(out));
  std::error_code ec;
  fs::remove(control.checkpoint, ec);
  if (world) world->finish();

  spdlog::info("policy: {} ({} of {} budget; full KV would need {}), calibrated in {:.1f}s",
               args.output, format_bytes(policy.memory.total_bytes), format_bytes(budget),
               format_bytes(policy.memory.full_kv_total_bytes), out.seconds);
  if (!args.report.empty()) spdlog::info("report: {}", args.report);
  if (!args.plot.empty()) spdlog::info("heat map: {}", args.plot);
  // Where the policy can run: an h2o head keeps it out of every engine without token selection.
  const std::string model_type =
      arch::load_model_spec(io::resolve_model_dir(args.request.model)).model_type;
  spdlog::info("{}", policy::serving_note(policy, model_type, args.output));
  if (args.flags.json) {
    std::cout << nlohmann::json{{"policy", args.output},
                                {"total_bytes", policy.memory.total_bytes},
                                {"budget_bytes", budget},
                                {"full_kv_total_bytes", policy.memory.full_kv_total_bytes},
                                {"seconds", out.seconds}}
                     .dump()
              << "\n";
  }
}

const RegisterCommand kRegister{
    "calibrate", [](CLI::App& root) {
      static CalibrateArgs args;
      root.add_option("--model", args.request.model,
                      "Model folder (config.json + safetensors) or cached HF repo id");
      root.add_option("--context", args.request.context,
                      "Context length to serve, tokens (k = 1024: 160k = 163840)");
      root.add_option("--budget", args.request.budget,
                      "Cache budget for the whole request batch (g = GiB: 48g)");
      root.add_option("-o,--output", args.output, "Policy file to write")->capture_default_str();
      root.add_option("--windows", args.request.windows,
                      "Window ladder, ascending; 'full' = untruncated")
          ->capture_default_str();
      root.add_option(
          "--calib", args.request.calib,
          "Calibration JSONL ({\"text\": ...} or {\"input_ids\": [...]}); default: built-in "
          "synthetic retrieval set");
      root.add_option("--samples", args.request.samples, "Calibration sequences")
          ->capture_default_str();
      root.add_option("--seq-len", args.request.seq_len,
                      "Tokens per calibration sequence; auto: the largest finite --windows level "
                      "below --context plus a "
                      "quarter (at least 2k), so every level is measured")
          ->capture_default_str();
      root.add_option("--distortion", args.request.distortion,
                      "What a window costs: answer-tv-span (total variation to the full model's "
                      "next-token distribution "
                      "at the answer positions, heads of a layer decided jointly; each candidate "
                      "runs on the answer span "
                      "against the layers' cached prompt, so its cost does not grow with depth: "
                      "docs/seqcalib.md), "
                      "answer-kl-span (the same with KL), answer-tv (the exact measure: the layers "
                      "above run over every "
                      "token for each candidate), "
                      "answer-kl (the same with KL, which a lost needle dominates), answer-grad "
                      "(the KL predicted to second "
                      "order from gradients: one backward pass per probe instead of a run per "
                      "assignment) or block-mse "
                      "(the attention block's output error over all positions)")
          ->capture_default_str();
      root.add_option("--span-margin", args.request.span_margin,
                      "answer-*-span: tokens before the first answer position that the span "
                      "measure also runs exactly "
                      "(the question's own tokens and context before it)")
          ->capture_default_str();
      root.add_flag("--re-solve-by-rewalk", args.request.resolve_by_rewalk,
                    "answer-*-span: after the cross-layer re-solve, re-walk the layers above the "
                    "lowest layer it moves (one more walk of them, each re-decided) instead of "
                    "checking the re-solved policy on the answer span (the default; its cost does "
                    "not grow with depth)");
      root.add_flag("--independent-heads", args.request.independent_heads,
                    "answer-kl/answer-grad: decide a layer's heads from curves measured with the "
                    "other heads at full "
                    "(the ablation of the joint decision)");
      root.add_flag("--validate-measure", args.request.validate_measure,
                    "answer-grad, answer-*-span: also measure every probe (head, level) and each "
                    "layer's decision with "
                    "the exact measure (and, for the span measures, the exact measure's own "
                    "decision) and report the "
                    "prediction against it (report.json: measure_validation)");
      root.add_option("--extrapolate", args.request.extrapolate,
                      "Rule for --windows levels >= --seq-len: none (refuse), power-law (each "
                      "head's curve fitted over its "
                      "measured levels, capped at the largest) or as-full (read as full KV's cost)")
          ->capture_default_str();
      root.add_option("--keep-rules", args.request.keep_rules,
                      "What may fill a head's slots: window (its most recent tokens; any engine "
                      "with per-head windows "
                      "can serve the policy) or window,h2o (each head whose slots evict on the "
                      "calibration data is also "
                      "measured with H2O's heavy hitters, on the conditioned stream through the "
                      "runtime's own eviction "
                      "code, and keeps whichever costs the answers less; the layer's selection "
                      "bookkeeping is paid from "
                      "the budget). auto: window,h2o with an answer measure, window with block-mse")
          ->capture_default_str();
      root.add_option("--prefill-chunk", args.request.prefill_chunk,
                      "With h2o keep rules: tokens per prefill chunk the runtime will use (H2O "
                      "evicts after each; "
                      "eval's default)")
          ->capture_default_str();
      root.add_option("--block-size", args.request.block_size,
                      "Paged-cache block in tokens (1 = unpaged)")
          ->capture_default_str();
      root.add_option("--batch", args.request.batch, "Sequences served at once")
          ->capture_default_str();
      root.add_option("--sink-tokens", args.request.sink_tokens,
                      "First tokens every windowed head keeps")
          ->capture_default_str();
      root.add_option("--kv-dtype", args.request.kv_dtype,
                      "KV cache dtype (default: the checkpoint's)");
      root.add_option("--state-dtype", args.request.state_dtype,
                      "dtype the serving cache keeps every recurrent/conv state in (policy's "
                      "state_dtype; its bytes follow "
                      "it): float32 (default: the runtime then computes the model calibration "
                      "measured, whatever the "
                      "prefill chunking), bfloat16, float16, or native (each state's own dtype: "
                      "the checkpoint's for "
                      "convolution states, float32 for recurrent/SSM states; what policies without "
                      "the field mean)")
          ->capture_default_str();
      root.add_option("--seed", args.request.seed, "Seed for the calibration data")
          ->capture_default_str();
      root.add_option("--device", args.request.device, "cpu, cuda or cuda:N")
          ->capture_default_str();
      root.add_option("--dtype", args.request.dtype,
                      "Compute dtype (default: float32 on CPU, the checkpoint's on CUDA)");
      root.add_option("--report", args.report,
                      "JSON report: curves, lambdas, timings, peak memory");
      root.add_option("--plot", args.plot, "SVG heat map of layers x KV heads → window");
      root.add_option("--micro-batch", args.request.micro_batch,
                      "Sequences per layer call (default: all)");
      root.add_option("--probe-samples", args.request.probe_samples,
                      "Sequences for the full-KV probe pass, which steers the walk's budget "
                      "controller (default: half, rounded up)");
      root.add_option("--attention-chunk", args.request.attention_chunk,
                      "Queries per attention chunk")
          ->capture_default_str();
      root.add_option("--activations", args.request.activations,
                      "Where calibration activations live: auto, device, host")
          ->capture_default_str();
      root.add_flag("--no-conditioning", args.request.no_conditioning,
                    "Decide from curves measured with full KV below (the ablation baseline)");
      root.add_flag(
          "--resume", args.resume,
          "Continue the run killed while writing this -o from its checkpoint (<output>.ckpt.json)");
      root.add_option("--rank", args.launch.rank,
                      "Distributed: this process's rank (default: RANK, as torchrun sets it)");
      root.add_option("--world-size", args.launch.world_size,
                      "Distributed: number of processes (default: WORLD_SIZE, else 1); see "
                      "docs/distributed.md");
      root.add_option("--master-addr", args.launch.master_addr,
                      "Distributed: host of rank 0's store (default: MASTER_ADDR)");
      root.add_option("--master-port", args.launch.master_port,
                      "Distributed: its port (default: MASTER_PORT, else 29500)");
      root.add_option("--dist-timeout", args.launch.timeout_seconds,
                      "Distributed: seconds before a silent rank (no heartbeat) or an unreachable "
                      "store stops the run")
          ->capture_default_str();
      add_common_flags(&root, args.flags, /*with_json=*/true);
      root.callback([&root] {
        if (!root.get_subcommands().empty()) return;
        if (args.request.model.empty() && args.request.context.empty() &&
            args.request.budget.empty())
          throw CLI::CallForHelp();
        for (const auto& [flag, value] : {std::pair{"--model", &args.request.model},
                                          {"--context", &args.request.context},
                                          {"--budget", &args.request.budget}}) {
          if (value->empty()) throw_input_error("{} is required (see --help)", flag);
        }
        run_calibrate(args);
      });
    }};

}  // namespace
}  // namespace headwise::cli
