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
  CalibrationFlags calibration;
  std::string output = "policy.yaml";
  std::string report;
  std::string plot;
  bool resume = false;
  dist::LaunchFlags launch;
  CommonFlags flags;
};

void check_outputs_writable(const CalibrateArgs& args) {
  for (const auto& path : {args.output, args.report, args.plot}) {
    if (!path.empty()) require_output_folder(path, path);
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
  const calib::CalibrationOptions options =
      calib::parse_calibration_options(args.calibration.request());
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

  // With --engine vllm the budget counts vLLM's reservation (the policy's engine record).
  const int64_t total = policy.engine ? policy.engine->total_bytes : policy.memory.total_bytes;
  spdlog::info("policy: {} ({} of {} budget{}; full KV would need {}), calibrated in {:.1f}s",
               args.output, format_bytes(total), format_bytes(budget),
               policy.engine ? " in vLLM's reservation" : "",
               format_bytes(policy.engine ? policy.engine->full_kv_total_bytes
                                          : policy.memory.full_kv_total_bytes),
               out.seconds);
  if (!args.report.empty()) spdlog::info("report: {}", args.report);
  if (!args.plot.empty()) spdlog::info("heat map: {}", args.plot);
  // Where the policy can run: an h2o head keeps it out of every engine without token selection.
  const std::string model_type =
      arch::load_model_spec(io::resolve_model_dir(options.model)).model_type;
  spdlog::info("{}", policy::serving_note(policy, model_type, args.output));
  if (args.flags.json) {
    std::cout << nlohmann::json{{"policy", args.output},
                                {"total_bytes", total},
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
      // Every calibration option (calib/calibration_options.hpp), the outputs among them.
      args.calibration.add_to(root, [&root](std::string_view field) {
        if (field == "budget")
          root.add_option("-o,--output", args.output, "Policy file to write")
              ->capture_default_str();
        if (field == "dtype") {
          root.add_option("--report", args.report,
                          "JSON report: curves, lambdas, timings, peak memory");
          root.add_option("--plot", args.plot, "SVG heat map of layers x KV heads → window");
        }
      });
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
        args.calibration.check_required();
        run_calibrate(args);
      });
    }};

}  // namespace
}  // namespace headwise::cli
