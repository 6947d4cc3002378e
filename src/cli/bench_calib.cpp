// Hidden `headwise-calc bench-calib`: the performance benchmark behind tools/bench-calib.
// Side by side in one process: one plain forward and whole calibrations as the main command runs
// them (the default, and other measures when asked) over the same tokens of the same model, the
// one-pass multi-window attention against per-level masked attention, and the exact solver at
// 64 layers x 8 KV heads x 6 levels. Prints one JSON object.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>

#include "bench.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/calib/calibration_data.hpp"
#include "headwise/calib/calibration_job.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/resources.hpp"
#include "headwise/core/units.hpp"
#include "headwise/io/checkpoint.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/report/calib_report.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::cli {
namespace {

struct BenchArgs {
  std::string model;
  bool quick = false;
  std::string device = "cpu";
  int64_t samples = 0;  // 0: 2
  std::string seq_len;  // default: 1k quick, 8k full
  std::string windows;  // default: 5 levels ending in full, scaled to seq_len
  int64_t attention_chunk = 512;
  int64_t attention_steps = 8192;
  int64_t attention_head_dim = 0;  // 0: 64 quick, 128 full
  bool skip_seqcalib = false;
  bool skip_kernels = false;
  // Calibrations to time, each through the main command's own job: "default" (every option at
  // its default) and any --distortion value.
  std::vector<std::string> measures{"default", "block-mse"};
  // Runs of the forward and of each calibration; the fastest of each is reported (a 2-core
  // machine's other work only ever adds time).
  int64_t repeats = 1;
  CommonFlags flags;
};

// Embedding and decoder layers with exact attention, each layer's weights streamed in and
// released as SeqCalib does.
void forward_layers(arch::DecoderModel& model, const at::Tensor& ids) {
  c10::InferenceMode inference;
  at::Tensor hidden = model.embed(ids);
  arch::ExactAttentionCore exact(model.attention_chunk());
  for (int64_t i = 0; i < model.spec().num_layers(); ++i) {
    model.prefetch_layer(i + 1);
    hidden = model.run_layer(i, hidden, {&exact, nullptr, 0});
    model.release_layer(i);
  }
}

// This process's CPU seconds (every thread): next to wall time, the work a run did whatever else
// the machine runs at the same time (2 cores shared with other jobs make wall time noisy).
double cpu_seconds() {
  return static_cast<double>(std::clock()) / CLOCKS_PER_SEC;
}

// Half of full KV's global bytes at the calibration length, plus the fixed bytes: the controller,
// the descent and the completion all have real choices to make.
int64_t half_budget(const arch::ModelSpec& spec, int64_t context) {
  memory::MemoryOptions mem;
  mem.context = context;
  mem.kv_dtype = spec.dtype;
  const int64_t fixed = memory::fixed_bytes(spec, mem);
  return fixed + (memory::full_kv_bytes(spec, mem) - fixed) / 2;
}

// One calibration as the main command runs it: every option at its default but the model, the
// ladder, the 50% budget, the calibration size and the measure (`distortion`; empty: the default).
double calibration_seconds(const BenchArgs& args, const std::string& distortion, int64_t samples,
                           int64_t steps, const std::string& windows, const arch::ModelSpec& spec,
                           nlohmann::json& details) {
  calib::CalibrationRequest request = {{"model", args.model},
                                       {"context", std::to_string(steps)},
                                       {"budget", std::to_string(half_budget(spec, steps))},
                                       {"windows", windows},
                                       {"samples", std::to_string(samples)},
                                       {"seq_len", std::to_string(steps)},
                                       {"device", args.device},
                                       {"attention_chunk", std::to_string(args.attention_chunk)}};
  // "stable": the default calibration with --decisions stable (issue 59).
  if (distortion == "stable") {
    request["decisions"] = "stable";
  } else if (!distortion.empty()) {
    request["distortion"] = distortion;
  }
  const calib::CalibrationOptions options = calib::parse_calibration_options(request);
  const auto output = std::filesystem::temp_directory_path() / "headwise-bench-calib-policy.yaml";
  calib::CalibrationJob job(options, output);
  calib::RunControl control;
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = cpu_seconds();
  const calib::CalibrationOutcome outcome = job.run(control);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu = cpu_seconds() - cpu_start;
  const nlohmann::json report = report::calibration_report(outcome);
  details = {{"seconds", seconds},
             {"cpu_seconds", cpu},
             {"distortion", calib::distortion_measure_name(options.distortion)},
             {"total_bytes", outcome.policy.memory.total_bytes},
             {"budget_bytes", options.budget},
             {"answer_evaluations", report.at("answer_kl").is_object()
                                        ? report["answer_kl"].value("evaluations", int64_t{0})
                                        : 0},
             {"keep_rules", report.contains("keep_rules") ? report["keep_rules"]["seconds"]
                                                          : nlohmann::json(nullptr)}};
  return seconds;
}

nlohmann::json bench_seqcalib(const BenchArgs& args, int64_t samples, int64_t steps,
                              const std::string& windows) {
  c10::InferenceMode inference;
  arch::ModelOptions options;
  options.device = args.device;
  options.attention_chunk = args.attention_chunk;
  const auto dir = io::resolve_model_dir(args.model);
  auto model = arch::load_model(dir, options);
  const auto& spec = model->spec();
  // The tokens the calibrations use: the built-in retrieval set at this length, seed 0.
  const auto data = calib::load_calibration_data("", dir, spec.vocab_size, samples, steps, 0);
  at::Tensor ids = at::empty({samples, steps}, at::kLong);
  for (int64_t i = 0; i < samples; ++i) {
    std::memcpy(ids[i].data_ptr<int64_t>(), data.sequences[static_cast<size_t>(i)].data(),
                static_cast<size_t>(steps) * sizeof(int64_t));
  }
  ids = ids.to(model->device());
  const at::Device device = model->device();

  // Warm-up forward: page cache, allocator and thread pools, so neither timed run pays for them.
  (void)model->forward(ids.slice(1, 0, std::min<int64_t>(steps, 256)));
  model->release_all();
  // The floor the calibrations are held to: the decoder layers once over the tokens, streamed the
  // same way. The full forward with the head is reported too.
  reset_peak_rss();
  // The fastest run's wall and CPU time, as for the calibrations below.
  double forward_ms = 0.0, forward_cpu = 0.0;
  for (int64_t run = 0; run < args.repeats; ++run) {
    const double cpu_start = cpu_seconds();
    const double ms = bench::best_ms(device, 1, [&] { forward_layers(*model, ids); });
    if (run == 0 || ms < forward_ms) {
      forward_ms = ms;
      forward_cpu = cpu_seconds() - cpu_start;
    }
  }
  const int64_t forward_peak_rss = peak_rss_bytes();
  model->release_all();
  const double forward_head_ms = bench::best_ms(device, 1, [&] { (void)model->forward(ids); });
  model->release_all();

  nlohmann::json by_measure = nlohmann::json::object(), by_measure_cpu = nlohmann::json::object();
  nlohmann::json details = nlohmann::json::object();
  double default_seconds = 0.0;
  int64_t default_peak_rss = 0;
  for (const std::string& measure : args.measures) {
    reset_peak_rss();
    nlohmann::json d;
    double seconds = 0.0;
    for (int64_t run = 0; run < args.repeats; ++run) {
      nlohmann::json this_run;
      const double s = calibration_seconds(args, measure == "default" ? "" : measure, samples,
                                           steps, windows, spec, this_run);
      if (run == 0 || s < seconds) {
        seconds = s;
        d = std::move(this_run);
      }
    }
    d["runs"] = args.repeats;
    d["peak_rss_bytes"] = peak_rss_bytes();
    const std::string name = measure == "default" ? d["distortion"].get<std::string>() : measure;
    by_measure[name] = seconds * 1000 / forward_ms;
    by_measure_cpu[name] = d["cpu_seconds"].get<double>() / forward_cpu;
    if (measure == "default") {
      default_seconds = seconds;
      default_peak_rss = d["peak_rss_bytes"];
    }
    details[measure] = d;
  }
  nlohmann::json out = {{"seqcalib_over_forward_by_measure", by_measure},
                        {"seqcalib_over_forward_cpu_by_measure", by_measure_cpu},
                        {"forward_cpu_seconds", forward_cpu},
                        {"calibrations", details},
                        {"forward_seconds", forward_ms / 1000},
                        {"forward_with_head_seconds", forward_head_ms / 1000},
                        {"forward_peak_rss_bytes", forward_peak_rss},
                        {"model_bytes", model->checkpoint().weight_bytes()},
                        {"model", dir.string()},
                        {"model_type", spec.model_type},
                        {"layers", spec.num_layers()},
                        {"global_layers", static_cast<int64_t>(spec.global_layer_ids().size())},
                        {"samples", samples},
                        {"seq_len", steps},
                        {"windows", windows},
                        {"device", device.str()},
                        {"compute_dtype", c10::toString(model->dtype())}};
  if (default_seconds > 0) {
    // The default calibration (measure, keep rules, completion: all of the main command) over one
    // forward.
    out["seqcalib_over_forward"] = default_seconds * 1000 / forward_ms;
    out["seqcalib_over_forward_cpu"] =
        details["default"]["cpu_seconds"].get<double>() / forward_cpu;
    out["seqcalib_over_forward_with_head"] = default_seconds * 1000 / forward_head_ms;
    out["seqcalib_seconds"] = default_seconds;
    out["peak_rss_bytes"] = default_peak_rss;
  }
  return out;
}

void run(const BenchArgs& args) {
  apply_logging(args.flags);
  const int64_t samples = args.samples > 0 ? args.samples : 4;
  const int64_t steps = parse_token_count(
      args.seq_len.empty() ? (args.quick ? "1k" : "8k") : args.seq_len, "--seq-len");
  const std::string windows = !args.windows.empty() ? args.windows
                              : steps >= 8192       ? "256,1k,2k,4k,full"
                                                    : fmt::format("{},{},{},{},full", steps / 32,
                                                                  steps / 8, steps / 4, steps / 2);
  nlohmann::json out;
  if (!args.skip_seqcalib) {
    if (args.model.empty())
      throw_input_error("bench-calib: --model is required (tools/bench-calib builds one)");
    out = bench_seqcalib(args, samples, steps, windows);
  }
  if (!args.skip_kernels) {
    const at::Device device(args.device);
    bench::AttentionBenchShape shape;
    shape.steps = args.attention_steps;
    shape.head_dim =
        args.attention_head_dim > 0 ? args.attention_head_dim : (args.quick ? 64 : 128);
    if (args.quick) {  // same T and ladder, a quarter of the heads: the masked reference is slow
      shape.heads = 4;
      shape.kv_heads = 1;
    }
    shape.chunk = args.attention_chunk;
    shape.repeats = args.quick ? 1 : 3;
    out.update(
        bench::bench_multiwindow(shape, device, device.is_cpu() ? at::kFloat : at::kBFloat16));
    out["solver_ms"] = solve::benchmark_solver_ms(64, 8, 6, /*seed=*/1, /*sink_tokens=*/4);
    out["solver_shape"] = "64 layers x 8 KV heads x 6 levels";
  }
  out["quick"] = args.quick;
  out["threads"] = at::get_num_threads();
  if (args.flags.json) {
    std::cout << out.dump() << "\n";
    return;
  }
  std::cout << out.dump(2) << "\n";
}

const RegisterCommand kRegister{
    "bench-calib", [](CLI::App& root) {
      static BenchArgs args;
      // Hidden (empty group): a developer tool, run through tools/bench-calib.
      auto* cmd = root.add_subcommand("bench-calib",
                                      "Benchmark SeqCalib, multi-window attention and the solver")
                      ->group("");
      cmd->add_option("--model", args.model,
                      "Model folder to calibrate (tools/make_bench_model.py builds one)");
      cmd->add_flag("--quick", args.quick, "Small sizes: under a minute on a laptop");
      cmd->add_option("--device", args.device, "cpu, cuda or cuda:N")->capture_default_str();
      cmd->add_option("--samples", args.samples, "Calibration sequences (default 4)");
      cmd->add_option("--seq-len", args.seq_len, "Tokens per sequence (default 1k quick, 8k full)");
      cmd->add_option("--windows", args.windows, "SeqCalib window ladder (default: 5 levels)");
      cmd->add_option("--attention-chunk", args.attention_chunk, "Queries per attention chunk")
          ->capture_default_str();
      cmd->add_option("--attention-steps", args.attention_steps, "T of the multi-window timing")
          ->capture_default_str();
      cmd->add_option("--attention-head-dim", args.attention_head_dim,
                      "head_dim of the multi-window timing");
      cmd->add_flag("--skip-seqcalib", args.skip_seqcalib, "Only the attention and solver timings");
      cmd->add_flag("--skip-kernels", args.skip_kernels,
                    "Only the calibrations (no attention or solver timings)");
      cmd->add_option("--measures", args.measures,
                      "Calibrations to time against one forward: default (the main command's "
                      "defaults), stable (the defaults with --decisions stable) and/or "
                      "--distortion values (answer-tv, answer-grad, block-mse, ...)")
          ->delimiter(',')
          ->capture_default_str();
      cmd->add_option("--repeats", args.repeats,
                      "Runs of the forward and of each calibration; the fastest of each is "
                      "reported")
          ->capture_default_str()
          ->check(CLI::Range(int64_t{1}, int64_t{100}));
      add_common_flags(cmd, args.flags, /*with_json=*/true);
      cmd->callback([] { run(args); });
    }};

}  // namespace
}  // namespace headwise::cli
