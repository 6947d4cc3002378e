// Hidden `headwise-calc bench-calib`: the performance benchmark behind tools/bench-calib.
// Side by side in one process: one plain forward and one SeqCalib run over the same tokens
// of the same model, the one-pass multi-window attention against per-level masked attention,
// and the exact solver at 64 layers x 8 KV heads x 6 levels. Prints one JSON object.
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <iostream>
#include <random>

#include "bench.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/calib/calibration_data.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/resources.hpp"
#include "headwise/core/units.hpp"
#include "headwise/io/checkpoint.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::cli {
namespace {

struct BenchArgs {
  std::string model;
  bool quick = false;
  std::string device = "cpu";
  int64_t samples = 0;        // 0: 2
  std::string seq_len;        // default: 1k quick, 8k full
  std::string windows;        // default: 5 levels ending in full, scaled to seq_len
  int64_t probe_samples = -1;  // -1: SeqCalibOptions' default
  int64_t attention_chunk = 512;
  int64_t attention_steps = 8192;
  int64_t attention_head_dim = 0;  // 0: 64 quick, 128 full
  bool skip_seqcalib = false;
  bool skip_answer_kl = false;
  CommonFlags flags;
};

std::vector<std::vector<int64_t>> random_tokens(int64_t samples, int64_t steps, int64_t vocab) {
  std::mt19937_64 rng(1234);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(samples));
  for (auto& seq : out) {
    seq.resize(static_cast<size_t>(steps));
    for (auto& t : seq) t = token(rng);
  }
  return out;
}

at::Tensor as_batch(const std::vector<std::vector<int64_t>>& seqs) {
  at::Tensor ids = at::empty({static_cast<int64_t>(seqs.size()), static_cast<int64_t>(seqs[0].size())}, at::kLong);
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::memcpy(ids[static_cast<int64_t>(i)].data_ptr<int64_t>(), seqs[i].data(), seqs[i].size() * sizeof(int64_t));
  }
  return ids;
}

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

// Budget half-way between every head at the smallest level and every head at full: the
// controller and the completion both have real choices to make.
int64_t half_budget(const arch::ModelSpec& spec, const measure::WindowLadder& ladder, const memory::MemoryOptions& mem) {
  int64_t low = 0, high = 0;
  for (int64_t id : spec.global_layer_ids()) {
    const auto& att = *spec.layer(id).attention;
    low += att.num_kv_heads * memory::head_bytes(att, ladder.levels.front(), mem);
    high += att.num_kv_heads * memory::head_bytes(att, kFullWindow, mem);
  }
  return low + (high - low) / 2;
}

nlohmann::json bench_seqcalib(const BenchArgs& args, int64_t samples, int64_t steps, const std::string& windows) {
  c10::InferenceMode inference;
  arch::ModelOptions options;
  options.device = args.device;
  options.attention_chunk = args.attention_chunk;
  const auto dir = io::resolve_model_dir(args.model);
  auto model = arch::load_model(dir, options);
  const auto& spec = model->spec();
  const auto seqs = random_tokens(samples, steps, spec.vocab_size);
  const at::Tensor ids = as_batch(seqs).to(model->device());
  const at::Device device = model->device();

  // Warm-up forward: page cache, allocator and thread pools, so neither timed run pays for them.
  (void)model->forward(ids.slice(1, 0, std::min<int64_t>(steps, 256)));
  model->release_all();
  // The floor SeqCalib is held to: the decoder layers once over the tokens, streamed the same
  // way (no logits: SeqCalib computes none). The full forward with the head is reported too.
  reset_peak_rss();
  const double forward_ms = bench::best_ms(device, 1, [&] { forward_layers(*model, ids); });
  const int64_t forward_peak_rss = peak_rss_bytes();
  model->release_all();
  const double forward_head_ms = bench::best_ms(device, 1, [&] { (void)model->forward(ids); });
  model->release_all();

  memory::MemoryOptions mem;
  mem.context = steps;
  mem.kv_dtype = spec.dtype;
  calib::SeqCalibOptions o;
  o.ladder = measure::parse_window_ladder(windows, "--windows");
  o.global_budget_bytes = half_budget(spec, o.ladder, mem);
  o.head_bytes = [&mem](const arch::LayerSpec& layer, int64_t w) { return memory::head_bytes(*layer.attention, w, mem); };
  o.micro_batch = samples;
  if (args.probe_samples >= 0) o.probe_samples = args.probe_samples;
  const int64_t rss_before = current_rss_bytes();
  reset_peak_rss();
  calib::SeqCalibResult result;
  const double seqcalib_ms = bench::best_ms(device, 1, [&] { result = calib::run_seqcalib(*model, seqs, o); });

  // Where the walk's time goes: global layers (measure + decide + windowed pass) vs the rest.
  double global_s = 0, other_s = 0;
  for (const auto& layer : result.layers) (spec.layer(layer.layer_id).is_global() ? global_s : other_s) += layer.seconds;

  // The answer-aware measure over the same tokens (random tokens: the tail rule's positions).
  nlohmann::json by_measure = {{"block-mse", seqcalib_ms / forward_ms}};
  nlohmann::json answer_kl = nullptr, answer_grad = nullptr;
  if (!args.skip_answer_kl) {
    o.measure = calib::DistortionMeasure::kAnswerKl;
    o.answer_positions = calib::tail_answer_positions(seqs, calib::kAnswerTailPositions);
    calib::SeqCalibResult answer;
    const double answer_ms = bench::best_ms(device, 1, [&] { answer = calib::run_seqcalib(*model, seqs, o); });
    by_measure["answer-kl"] = answer_ms / forward_ms;
    answer_kl = {{"seconds", answer_ms / 1000},
                 {"probe_seconds", answer.probe_seconds},
                 {"evaluations", answer.answer_kl_evaluations},
                 {"peak_rss_bytes", answer.peak_rss_bytes}};
    o.measure = calib::DistortionMeasure::kAnswerGrad;
    calib::SeqCalibResult gradient;
    const double gradient_ms = bench::best_ms(device, 1, [&] { gradient = calib::run_seqcalib(*model, seqs, o); });
    by_measure["answer-grad"] = gradient_ms / forward_ms;
    answer_grad = {{"seconds", gradient_ms / 1000},
                   {"probe_seconds", gradient.probe_seconds},
                   {"exact_evaluations", gradient.answer_kl_evaluations},
                   {"peak_rss_bytes", gradient.peak_rss_bytes}};
  }
  return {{"seqcalib_over_forward", seqcalib_ms / forward_ms},
          {"seqcalib_over_forward_by_measure", by_measure},
          {"answer_kl", answer_kl},
          {"answer_grad", answer_grad},
          {"seqcalib_over_forward_with_head", seqcalib_ms / forward_head_ms},
          {"forward_seconds", forward_ms / 1000},
          {"forward_with_head_seconds", forward_head_ms / 1000},
          {"forward_peak_rss_bytes", forward_peak_rss},
          {"seqcalib_seconds", seqcalib_ms / 1000},
          {"probe_seconds", result.probe_seconds},
          {"walk_global_layer_seconds", global_s},
          {"walk_other_layer_seconds", other_s},
          {"probe_samples", calib::effective_probe_samples(o.probe_samples, samples)},
          {"peak_rss_bytes", result.peak_rss_bytes},
          {"rss_before_seqcalib_bytes", rss_before},
          {"peak_device_bytes", result.peak_device_bytes},
          {"model_bytes", model->checkpoint().weight_bytes()},
          {"model", dir.string()},
          {"layers", spec.num_layers()},
          {"global_layers", static_cast<int64_t>(spec.global_layer_ids().size())},
          {"samples", samples},
          {"seq_len", steps},
          {"windows", o.ladder.to_string()},
          {"device", device.str()},
          {"compute_dtype", c10::toString(model->dtype())},
          {"activations", result.activations}};
}

void run(const BenchArgs& args) {
  apply_logging(args.flags);
  const int64_t samples = args.samples > 0 ? args.samples : 2;
  const int64_t steps = parse_token_count(args.seq_len.empty() ? (args.quick ? "1k" : "8k") : args.seq_len, "--seq-len");
  const std::string windows = !args.windows.empty() ? args.windows
                              : steps >= 8192   ? "256,1k,2k,4k,full"
                                                : fmt::format("{},{},{},{},full", steps / 32, steps / 8, steps / 4, steps / 2);
  nlohmann::json out;
  if (!args.skip_seqcalib) {
    if (args.model.empty()) throw_input_error("bench-calib: --model is required (tools/bench-calib builds one)");
    out = bench_seqcalib(args, samples, steps, windows);
  }
  const at::Device device(args.device);
  bench::AttentionBenchShape shape;
  shape.steps = args.attention_steps;
  shape.head_dim = args.attention_head_dim > 0 ? args.attention_head_dim : (args.quick ? 64 : 128);
  if (args.quick) {  // same T and ladder, a quarter of the heads: the masked reference is slow
    shape.heads = 4;
    shape.kv_heads = 1;
  }
  shape.chunk = args.attention_chunk;
  shape.repeats = args.quick ? 1 : 3;
  out.update(bench::bench_multiwindow(shape, device, device.is_cpu() ? at::kFloat : at::kBFloat16));
  out["solver_ms"] = solve::benchmark_solver_ms(64, 8, 6, /*seed=*/1, /*sink_tokens=*/4);
  out["solver_shape"] = "64 layers x 8 KV heads x 6 levels";
  out["quick"] = args.quick;
  out["threads"] = at::get_num_threads();
  if (args.flags.json) {
    std::cout << out.dump() << "\n";
    return;
  }
  std::cout << out.dump(2) << "\n";
}

const RegisterCommand kRegister{"bench-calib", [](CLI::App& root) {
  static BenchArgs args;
  // Hidden (empty group): a developer tool, run through tools/bench-calib.
  auto* cmd = root.add_subcommand("bench-calib", "Benchmark SeqCalib, multi-window attention and the solver")->group("");
  cmd->add_option("--model", args.model, "Model folder to calibrate (tools/make_bench_model.py builds one)");
  cmd->add_flag("--quick", args.quick, "Small sizes: under a minute on a laptop");
  cmd->add_option("--device", args.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--samples", args.samples, "Calibration sequences (default 2)");
  cmd->add_option("--seq-len", args.seq_len, "Tokens per sequence (default 1k quick, 8k full)");
  cmd->add_option("--windows", args.windows, "SeqCalib window ladder (default: 5 levels)");
  cmd->add_option("--probe-samples", args.probe_samples, "Sequences for the probe pass (default: SeqCalib's)");
  cmd->add_option("--attention-chunk", args.attention_chunk, "Queries per attention chunk")->capture_default_str();
  cmd->add_option("--attention-steps", args.attention_steps, "T of the multi-window timing")->capture_default_str();
  cmd->add_option("--attention-head-dim", args.attention_head_dim, "head_dim of the multi-window timing");
  cmd->add_flag("--skip-seqcalib", args.skip_seqcalib, "Only the attention and solver timings");
  cmd->add_flag("--skip-answer-kl", args.skip_answer_kl, "Time SeqCalib with block-mse only (not answer-kl, answer-grad)");
  add_common_flags(cmd, args.flags, /*with_json=*/true);
  cmd->callback([] { run(args); });
}};

}  // namespace
}  // namespace headwise::cli
