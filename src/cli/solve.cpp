// `headwise-calc solve`: re-solve the per-head window allocation from stored curves for a new
// budget, in milliseconds. The result is approximate by nature: the curves were measured with
// the layers below running under the old policy's windows, so a different allocation would
// have been measured on a slightly different stream.
#include <spdlog/spdlog.h>

#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <optional>

#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"
#include "headwise/solve/curves.hpp"
#include "headwise/solve/mckp.hpp"
#include "headwise/solve/symmetric.hpp"

namespace headwise::cli {
namespace {

constexpr const char* kApproximateNote =
    "curves were measured conditioned on the policy they came from; re-run calibration for an "
    "exact policy";

struct SolveArgs {
  std::string curves;
  std::string budget;
  int64_t tensor_parallel_size = 1;
  bool bench = false;
  int bench_layers = 64;
  int bench_heads = 8;
  int bench_levels = 6;
  uint64_t bench_seed = 1;
  int64_t bench_sinks = 4;
  CommonFlags common;
};

void run_bench(const SolveArgs& args) {
  const double ms = solve::benchmark_solver_ms(
      args.bench_layers, args.bench_heads, args.bench_levels, args.bench_seed, args.bench_sinks);
  const nlohmann::json out = {{"solver_ms", ms},
                              {"groups", args.bench_layers * args.bench_heads},
                              {"levels", args.bench_levels},
                              {"sink_tokens", args.bench_sinks}};
  std::cout << out.dump() << "\n";
}

void print_human(const std::vector<solve::Group>& groups, const solve::SolveResult& result,
                 int64_t budget, double ms) {
  std::cout << fmt::format(
      "{} KV heads: {} of budget {} ({} of {} B), total distortion {:.6g}, {} in {:.2f} ms\n",
      groups.size(), format_bytes(result.total_bytes), format_bytes(budget), result.total_bytes,
      budget, result.total_distortion,
      result.proven_optimal ? "proven optimal" : "best found (state limit hit)", ms);
  // One line per layer, heads in file order: the shape a person compares with the policy.
  std::map<int64_t, std::vector<std::string>> layers;
  for (size_t g = 0; g < groups.size(); ++g) {
    layers[groups[g].layer_id].push_back(
        solve::window_label(groups[g].options[result.choice[g]].window));
  }
  for (const auto& [layer, windows] : layers) {
    std::cout << fmt::format("  layer {:>3}: {}\n", layer, fmt::join(windows, " "));
  }
  std::cout << "approximate: " << kApproximateNote << "\n";
}

void run(const SolveArgs& args) {
  apply_logging(args.common);
  if (args.bench) return run_bench(args);
  if (args.curves.empty()) throw_input_error("solve: --curves FILE is required");
  if (args.budget.empty()) throw_input_error("solve: --budget is required (e.g. 48g = 48 GiB)");
  const int64_t budget = parse_byte_size(args.budget, "--budget");
  const auto groups = solve::read_curves_file(args.curves);
  spdlog::debug("solve: {} heads from {}", groups.size(), args.curves);
  if (args.tensor_parallel_size < 1) {
    throw_input_error("--tensor-parallel-size: must be positive, got {}",
                      args.tensor_parallel_size);
  }
  const auto start = std::chrono::steady_clock::now();
  const solve::SolveResult free = solve::solve_exact(groups, budget);
  // Under tensor parallelism: the exact optimum whose every rank's shard of each layer holds
  // the same windows, beside the unconstrained one at the same budget.
  std::optional<solve::SymmetricResult> sym;
  if (args.tensor_parallel_size > 1)
    sym = solve::solve_symmetric(groups, args.tensor_parallel_size, budget);
  const solve::SolveResult& result = sym ? sym->result : free;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!args.common.json) {
    if (sym) {
      std::cout << fmt::format(
          "tensor parallel {}: every rank's shard of each layer holds the same windows; "
          "unconstrained optimum {:.6g} ({} B), constrained {:.6g} ({} B): distortion lost "
          "{:.6g}\n",
          args.tensor_parallel_size, free.total_distortion, free.total_bytes,
          result.total_distortion, result.total_bytes,
          result.total_distortion - free.total_distortion);
    }
    return print_human(groups, result, budget, ms);
  }
  nlohmann::json out = solve::solution_to_json(groups, result);
  if (sym) {
    out["tensor_parallel_size"] = args.tensor_parallel_size;
    out["unconstrained"] = {{"total_distortion", free.total_distortion},
                            {"total_bytes", free.total_bytes},
                            {"proven_optimal", free.proven_optimal}};
    out["distortion_lost"] = result.total_distortion - free.total_distortion;
  }
  out["budget"] = budget;
  out["approximate"] = true;
  out["approximate_reason"] = kApproximateNote;
  out["solve_ms"] = ms;
  std::cout << out.dump(1) << "\n";
}

const RegisterCommand kRegister("solve", [](CLI::App& root) {
  auto args = std::make_shared<SolveArgs>();
  auto* app =
      root.add_subcommand("solve",
                          "Re-solve per-head windows from stored curves for a new budget (exact "
                          "multiple-choice knapsack).\n"
                          "Approximate by nature: the curves were measured under the old policy.");
  app->add_option("--curves", args->curves,
                  "Curves JSON ({\"heads\": [...]}, or a calibration report that embeds them)");
  app->add_option("--budget", args->budget,
                  "Byte budget for the global-attention KV heads (48g = 48 GiB)");
  app->add_option("--tensor-parallel-size", args->tensor_parallel_size,
                  "Solve under vLLM's tensor parallelism: every rank's shard of each layer's KV "
                  "heads holds the same windows (exact); also states the unconstrained optimum "
                  "and the distortion the constraint loses");
  // Hidden: the benchmark the performance tooling calls.
  app->add_flag("--bench", args->bench)->group("");
  app->add_option("--bench-layers", args->bench_layers)->group("");
  app->add_option("--bench-heads", args->bench_heads)->group("");
  app->add_option("--bench-levels", args->bench_levels)->group("");
  app->add_option("--bench-seed", args->bench_seed)->group("");
  app->add_option("--bench-sinks", args->bench_sinks)->group("");
  add_common_flags(app, args->common, /*with_json=*/true);
  app->callback([args] { run(*args); });
});

}  // namespace
}  // namespace headwise::cli
