// The main command's calibration as a library job, so the CLI and `regen` run exactly the same code.
#include "headwise/calib/calibration_job.hpp"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <optional>

#include "headwise/arch/context_guard.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/answer_span.hpp"
#include "headwise/calib/calibration_data.hpp"
#include "headwise/calib/keep_rules.hpp"
#include "headwise/calib/memory_plan.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/calib/walk_state.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/core/resources.hpp"
#include "headwise/core/units.hpp"
#include "headwise/core/window.hpp"
#include "headwise/io/checkpoint.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/report/calib_report.hpp"

namespace headwise::calib {
namespace {
namespace fs = std::filesystem;

constexpr std::string_view kCheckpointSchema = "headwise/calib-checkpoint/v1";
// Bumped whenever the same inputs can give another policy (the measure, the descent, the
// completion changed): it is part of inputs_sha256, so a plain `regen` recalibrates policies an
// older calibration wrote instead of skipping them as unchanged.
//   2: lambda-priced joint descent, re-walks after the completion (2026-12-01).
constexpr int64_t kCalibrationRevision = 2;

ActivationPlacement parse_placement(const std::string& text) {
  if (text == "auto") return ActivationPlacement::kAuto;
  if (text == "device") return ActivationPlacement::kDevice;
  if (text == "host") return ActivationPlacement::kHost;
  throw_input_error("--activations: '{}' is not one of auto, device, host", text);
}

std::string model_name_of(const fs::path& dir, const arch::ModelSpec& spec) {
  const fs::path clean = dir.filename().empty() ? dir.parent_path() : dir;
  return clean.filename().string().empty() ? spec.model_type : clean.filename().string();
}

// model_path is read relative to the policy's own folder (mem-estimate, regen), so policies
// committed next to a model keep working from any checkout.
std::string model_path_for(const fs::path& model_dir, const fs::path& policy_path) {
  const fs::path policy_dir = fs::absolute(policy_path).parent_path();
  return fs::absolute(model_dir).lexically_normal().lexically_relative(policy_dir.lexically_normal()).string();
}

void refuse_if_it_cannot_fit(const MemoryPlan& plan) {
  spdlog::info("calibration memory: {}", plan.describe());
  if (plan.available_bytes && plan.device_peak_bytes() > *plan.available_bytes) {
    throw InfeasibleError(fmt::format("calibration needs about {} but only {} is available; lower --samples, --seq-len or "
                                      "--micro-batch, or use --activations host",
                                      format_bytes(plan.device_peak_bytes()), format_bytes(*plan.available_bytes)));
  }
}

// Says which levels the sequences cannot tell from full KV, and what the chosen rule does.
void refuse_unmeasured_levels(const std::vector<int64_t>& blind, int64_t seq_len, const std::string& rule) {
  if (blind.empty()) return;
  std::vector<std::string> names;
  for (int64_t w : blind) names.push_back(format_tokens(w));
  if (rule == "none") {
    throw_input_error("--windows levels {} are >= --seq-len {}: calibration sequences that short cannot measure them; "
                      "use --seq-len auto (or longer than {}), drop them from --windows, or choose a rule with "
                      "--extrapolate power-law or as-full",
                      fmt::join(names, ","), seq_len, format_tokens(blind.back()));
  }
  if (rule == "as-full") {
    spdlog::warn("window levels {} are >= --seq-len {}: not measured; --extrapolate as-full gives them full KV's "
                 "distortion (0): the solver prefers them to full KV",
                 fmt::join(names, ","), seq_len);
  } else {
    spdlog::warn("window levels {} are >= --seq-len {}: not measured; --extrapolate {} reads each head's cost there "
                 "off a power law fitted to its measured levels",
                 fmt::join(names, ","), seq_len, rule);
  }
}

std::optional<WalkState> read_checkpoint(const fs::path& path, const std::string& inputs_hash) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    spdlog::info("--resume: no checkpoint at {}; starting from the beginning", path.string());
    return std::nullopt;
  }
  const nlohmann::json j = read_json_file(path);
  if (!j.is_object() || j.value("schema", "") != kCheckpointSchema || !j.contains("inputs_sha256") || !j.contains("state")) {
    throw_input_error("{}: not a headwise calibration checkpoint (schema {}); delete it and rerun without --resume",
                      path.string(), kCheckpointSchema);
  }
  const std::string recorded = j["inputs_sha256"].is_string() ? j["inputs_sha256"].get<std::string>() : "";
  if (recorded != inputs_hash) {
    throw_input_error("{}: checkpoint was written for different inputs (inputs_sha256 {} here, {} now: model, "
                      "calibration data, options or tool version changed); rerun without --resume to start over",
                      path.string(), recorded.substr(0, 12), inputs_hash.substr(0, 12));
  }
  return walk_state_from_json(j["state"], path.string());
}

// Distributed: rank 0 reads (and checks) the checkpoint and sends it to the others, so the
// ranks need not share a file system.
std::optional<WalkState> shared_checkpoint(dist::Collective& world, const fs::path& path, const std::string& inputs_hash) {
  if (world.world_size() == 1) return read_checkpoint(path, inputs_hash);
  std::optional<WalkState> state;
  if (world.rank() == 0) state = read_checkpoint(path, inputs_hash);
  const std::string text = world.all_gather(state ? walk_state_to_json(*state).dump() : std::string(),
                                            "the resume checkpoint")[0];
  if (world.rank() == 0 || text.empty()) return state;
  return walk_state_from_json(nlohmann::json::parse(text), "rank 0's checkpoint " + path.string());
}

// Ranks that were given other flags or files would measure different things and deadlock or,
// worse, agree on a policy nobody asked for.
void refuse_ranks_with_other_inputs(dist::Collective& world, const std::string& inputs_hash) {
  if (world.world_size() == 1) return;
  const auto hashes = world.all_gather(inputs_hash, "the job's inputs");
  for (size_t r = 1; r < hashes.size(); ++r) {
    if (hashes[r] != hashes[0]) {
      throw_input_error("rank {} was started with other inputs than rank 0 (inputs_sha256 {} against {}): every rank "
                        "needs the same flags, model and calibration data",
                        r, hashes[r].substr(0, 12), hashes[0].substr(0, 12));
    }
  }
}

// `--device cuda` on rank r of a node is cuda:<LOCAL_RANK>, as torchrun's processes expect.
std::string rank_device(const std::string& device, const dist::Collective& world, int local_rank) {
  if (world.world_size() > 1 && device == "cuda") return fmt::format("cuda:{}", local_rank);
  return device;
}

// The default micro-batch is every sequence at once; distributed, each rank's share.
int64_t effective_micro_batch(int64_t requested, int64_t sequences, const dist::Collective& world) {
  if (requested > 0) return requested;
  return std::max<int64_t>(1, sequences / world.world_size());
}

}  // namespace

int64_t auto_calibration_length(const std::vector<int64_t>& levels, int64_t context) {
  int64_t largest = 0;
  for (int64_t w : levels) {
    if (w != kFullWindow && w < context) largest = std::max(largest, w);
  }
  const int64_t wanted = (largest + largest / 4 + 1023) / 1024 * 1024;
  return std::min(context, std::max<int64_t>(2048, wanted));
}

std::vector<int64_t> unmeasured_levels(const std::vector<int64_t>& levels, int64_t seq_len, int64_t context) {
  std::vector<int64_t> blind;
  for (int64_t w : levels) {
    if (w != kFullWindow && w >= seq_len && w < context) blind.push_back(w);
  }
  return blind;
}

fs::path checkpoint_path_for(const fs::path& output) { return fs::path(output.string() + ".ckpt.json"); }

struct CalibrationJob::State {
  CalibrationRequest request;
  fs::path output;
  fs::path dir;
  arch::ModelSpec spec;
  memory::MemoryOptions mem;
  int64_t budget = 0;
  int64_t fixed = 0;
  measure::WindowLadder ladder;
  int64_t seq_len = 0;
  DistortionMeasure measure = DistortionMeasure::kAnswerKl;
  std::string keep_rules;  // resolved: "window" or "window,h2o"
  bool selecting = false;  // keep_rules lets heads choose h2o
  std::vector<int64_t> unmeasured;
  CalibrationData data;
  policy::ModelFingerprint fingerprint;
  std::string model_path;
  std::string inputs_hash;
  std::optional<std::string> context_warning;  // the context exceeds the config's max_position_embeddings
};

CalibrationJob::CalibrationJob(const CalibrationRequest& request, const fs::path& output) : state_(new State) {
  State& s = *state_;
  s.request = request;
  s.output = output;
  s.dir = io::resolve_model_dir(request.model);
  s.spec = arch::load_model_spec(s.dir);

  s.mem.context = parse_token_count(request.context, "--context");
  s.context_warning = arch::check_context(s.spec, s.mem.context, "--context", (s.dir / "config.json").string());
  if (s.context_warning) spdlog::warn("{}", *s.context_warning);
  s.mem.batch = request.batch;
  s.mem.block_size = request.block_size;
  s.mem.sink_tokens = request.sink_tokens;
  s.mem.kv_dtype = request.kv_dtype.empty() ? s.spec.dtype : parse_dtype(request.kv_dtype, "--kv-dtype");
  if (request.state_dtype != "native") s.mem.state_dtype = policy::parse_state_dtype(request.state_dtype, "--state-dtype");
  memory::validate_options(s.mem);
  s.budget = parse_byte_size(request.budget, "--budget");
  s.ladder = measure::parse_window_ladder(request.windows, "--windows");
  s.seq_len = request.seq_len == "auto" ? auto_calibration_length(s.ladder.levels, s.mem.context)
                                        : parse_token_count(request.seq_len, "--seq-len");
  s.measure = parse_distortion_measure(request.distortion);
  if (request.validate_measure && s.measure != DistortionMeasure::kAnswerGrad && !span_measure(s.measure)) {
    throw_input_error("--validate-measure checks --distortion answer-grad, answer-tv-span or answer-kl-span against the "
                      "exact measure; got --distortion {}",
                      request.distortion);
  }
  if (request.span_margin < 0) throw_input_error("--span-margin must not be negative, got {}", request.span_margin);
  parse_extrapolation(request.extrapolate);  // InputError naming --extrapolate
  s.keep_rules = resolve_keep_rules(request.keep_rules, s.measure);
  s.selecting = parse_keep_rules(s.keep_rules);
  if (request.prefill_chunk <= 0) throw_input_error("--prefill-chunk must be positive, got {}", request.prefill_chunk);
  s.unmeasured = unmeasured_levels(s.ladder.levels, s.seq_len, s.mem.context);
  refuse_unmeasured_levels(s.unmeasured, s.seq_len, request.extrapolate);
  if (request.samples <= 0) throw_input_error("--samples must be positive, got {}", request.samples);
  parse_placement(request.activations);  // fail on a bad flag before any heavy work

  // Feasibility before any heavy work: fixed bytes plus the smallest level everywhere.
  s.fixed = memory::fixed_bytes(s.spec, s.mem);
  int64_t minimum = s.fixed;
  for (int64_t id : s.spec.global_layer_ids()) {
    const auto& att = *s.spec.layer(id).attention;
    minimum += att.num_kv_heads * memory::head_bytes(att, s.ladder.levels.front(), s.mem);
  }
  if (s.budget < minimum) {
    throw InfeasibleError(fmt::format("--budget {} is below the minimum {} ({} bytes: {} fixed for non-global layers + every "
                                      "global KV head at {} tokens) at context {}",
                                      format_bytes(s.budget), format_bytes(minimum), minimum, format_bytes(s.fixed),
                                      s.ladder.levels.front(), s.mem.context));
  }
  s.data = load_calibration_data(request.calib, s.dir, s.spec.vocab_size, request.samples, s.seq_len, request.seed);
  s.fingerprint = policy::fingerprint_model(s.dir);
  s.model_path = model_path_for(s.dir, output);

  // Everything that can change a byte of the policy. Activation placement is left out: it
  // only moves the same tensors between device and host memory.
  nlohmann::json inputs = {
      {"tool", fmt::format("headwise-calc {}", HEADWISE_VERSION)},
      {"calibration_revision", kCalibrationRevision},
      {"model_config_sha256", s.fingerprint.config_sha256},
      {"model_weights_headers_sha256", s.fingerprint.weights_headers_sha256.value_or("")},
      {"model_path", s.model_path},
      {"dataset", s.data.description},
      {"dataset_sha256", s.data.sha256},
      {"context", s.mem.context},
      {"budget_bytes", s.budget},
      {"windows", s.ladder.levels},
      {"samples", static_cast<int64_t>(s.data.sequences.size())},
      {"seq_len", s.seq_len},
      {"block_size", s.mem.block_size},
      {"batch", s.mem.batch},
      {"sink_tokens", s.mem.sink_tokens},
      {"kv_dtype", std::string(dtype_name(s.mem.kv_dtype))},
      {"seed", request.seed},
      {"device", request.device},
      {"dtype", request.dtype},
      {"micro_batch", request.micro_batch},
      {"probe_samples", request.probe_samples},
      {"attention_chunk", request.attention_chunk},
      {"conditioned", !request.no_conditioning},
      {"distortion", request.distortion},
      {"joint_heads", !request.independent_heads},
      {"extrapolate", request.extrapolate},
  };
  if (span_measure(s.measure)) inputs["span_margin"] = request.span_margin;
  // Only when not native, so that policies made before --state-dtype keep the hash they were made with.
  if (s.mem.state_dtype) inputs["state_dtype"] = std::string(dtype_name(*s.mem.state_dtype));
  // Only when chosen, so that window-only policies keep the hash they were made with.
  if (s.selecting) {
    inputs["keep_rules"] = s.keep_rules;
    inputs["prefill_chunk"] = request.prefill_chunk;
  }
  s.inputs_hash = sha256_hex(inputs.dump());
}

CalibrationJob::~CalibrationJob() = default;

const std::string& CalibrationJob::inputs_hash() const { return state_->inputs_hash; }

CalibrationOutcome CalibrationJob::run(const RunControl& control) {
  const State& s = *state_;
  const CalibrationRequest& r = s.request;
  dist::Collective& world = control.collective != nullptr ? *control.collective : dist::single_process();
  refuse_ranks_with_other_inputs(world, s.inputs_hash);
  const bool writer = world.rank() == 0;
  const auto sequences = static_cast<int64_t>(s.data.sequences.size());
  const int64_t micro_batch = effective_micro_batch(r.micro_batch, sequences, world);
  const auto local_sequences =
      static_cast<int64_t>(dist::shard_sequences(s.data.sequences.size(), micro_batch, world.rank(), world.world_size()).size());
  std::optional<WalkState> resume;
  if (control.resume && !control.checkpoint.empty()) resume = shared_checkpoint(world, control.checkpoint, s.inputs_hash);
  if (writer && !control.resume && !control.checkpoint.empty() && fs::exists(control.checkpoint)) {
    spdlog::warn("{} exists and will be replaced: pass --resume to continue that run instead", control.checkpoint.string());
  }

  arch::ModelOptions model_options;
  model_options.device = rank_device(r.device, world, control.local_rank);
  model_options.attention_chunk = r.attention_chunk;
  if (!r.dtype.empty()) model_options.compute_dtype = parse_dtype(r.dtype, "--dtype");
  const int64_t rss_before_model = current_rss_bytes();
  auto model = arch::load_model(s.dir, model_options);

  CalibrationShape shape{local_sequences, s.seq_len, micro_batch, r.attention_chunk,
                         static_cast<int64_t>(s.ladder.size()), static_cast<int64_t>(c10::elementSize(model->dtype()))};
  shape.answer_span = span_measure(s.measure);
  if (!r.no_conditioning) shape.stream_checkpoint_limit_bytes = kStreamCheckpointLimitBytes;
  const bool cpu = model->device().is_cpu();
  const MemoryPlan plan = plan_calibration_memory(s.spec, model->checkpoint(), shape, cpu || r.activations != "host",
                                                  cpu ? available_host_bytes() : free_device_bytes(model->device()));
  refuse_if_it_cannot_fit(plan);
  nlohmann::json memory_plan = plan.to_json();
  memory_plan["rss_before_model_bytes"] = rss_before_model;
  spdlog::info("calibrating {} ({} layers, {} global) on {} sequences x {} tokens, ladder {}, budget {} ({} fixed)",
               s.dir.string(), s.spec.num_layers(), s.spec.global_layer_ids().size(), s.data.sequences.size(), s.seq_len,
               s.ladder.to_string(), format_bytes(s.budget), format_bytes(s.fixed));

  SeqCalibOptions options;
  options.ladder = s.ladder;
  options.global_budget_bytes = s.budget - s.fixed;
  options.sink_tokens = r.sink_tokens;
  const memory::MemoryOptions mem = s.mem;
  options.head_bytes = [mem](const arch::LayerSpec& layer, int64_t window) {
    return memory::head_bytes(*layer.attention, window, mem);
  };
  options.micro_batch = micro_batch;
  options.probe_samples = r.probe_samples;
  options.conditioned = !r.no_conditioning;
  options.measure = s.measure;
  options.answer_positions = s.data.answer_positions;
  options.joint_heads = !r.independent_heads;
  options.validate_measure = r.validate_measure;
  options.unmeasured_levels = s.unmeasured;
  options.extrapolation = parse_extrapolation(r.extrapolate);
  options.activations = parse_placement(r.activations);
  options.resume = resume ? &*resume : nullptr;
  options.collective = &world;
  if (writer && !control.checkpoint.empty()) {
    options.checkpoint = [&](const WalkState& state) {
      const nlohmann::json j = {{"schema", kCheckpointSchema}, {"inputs_sha256", s.inputs_hash},
                                {"state", walk_state_to_json(state)}};
      write_file_atomically(control.checkpoint, j.dump() + "\n");
    };
  }
  // The answer-span measure's reference forward, on this rank's shard: SeqCalib and the keep-rules
  // pass both measure with it.
  std::unique_ptr<AnswerSpan> span;
  std::vector<std::vector<int64_t>> shard_sequences, shard_answers;
  if (span_measure(s.measure)) {
    for (size_t i : dist::shard_sequences(s.data.sequences.size(), micro_batch, world.rank(), world.world_size())) {
      shard_sequences.push_back(s.data.sequences[i]);
      shard_answers.push_back(s.data.answer_positions.at(i));
    }
    AnswerSpanOptions so;
    so.micro_batch = micro_batch;
    so.sink_tokens = r.sink_tokens;
    so.windows = s.ladder.levels;
    so.margin = r.span_margin;
    so.divergence = answer_divergence(s.measure);
    spdlog::info("{}: full-KV reference and the answer span's caches ({} sequences)", distortion_measure_name(s.measure),
                 shard_sequences.size());
    span = std::make_unique<AnswerSpan>(*model, shard_sequences, shard_answers, so, world);
    options.span = span.get();
  }
  const SeqCalibResult result = run_seqcalib(*model, s.data.sequences, options);

  CalibrationOutcome out;
  policy::Policy& policy = out.policy;
  policy.model_name = model_name_of(s.dir, s.spec);
  policy.model_path = s.model_path;
  policy.fingerprint = s.fingerprint;
  policy.budget_gb = static_cast<double>(s.budget) / static_cast<double>(int64_t{1} << 30);
  policy.context = s.mem.context;
  policy.batch = s.mem.batch;
  policy.dtype = s.mem.kv_dtype;
  policy.state_dtype = s.mem.state_dtype;
  policy.block_size = s.mem.block_size;
  policy.sink_tokens = s.mem.sink_tokens;
  policy.window_levels = s.ladder.levels;
  policy.calibration = {
      {"tool", fmt::format("headwise-calc {}", HEADWISE_VERSION)},
      {"method", options.conditioned ? "seqcalib" : "unconditioned"},
      {"distortion_measure", answer_aware(s.measure) ? distortion_measure_name(s.measure)
                                                            : "block_output_relative_mse"},
      {"dataset", s.data.description},
      {"dataset_sha256", s.data.sha256},
      {"samples", static_cast<int64_t>(s.data.sequences.size())},
      {"seq_len", s.seq_len},
      {"seed", r.seed},
      {"probe_samples", effective_probe_samples(r.probe_samples, static_cast<int64_t>(s.data.sequences.size()))},
      {"inputs_sha256", s.inputs_hash},
  };
  if (answer_aware(s.measure)) {
    policy.calibration["answer_positions"] = s.data.answer_rule;
    policy.calibration["heads"] = r.independent_heads ? "independent" : "joint";
    if (span) policy.calibration["answer_span"] = {{"first_position", span->span_begin()}, {"margin", r.span_margin}};
  }
  if (s.context_warning) {
    // Recorded so whoever deploys the policy sees it, not only whoever ran the calibration.
    policy.calibration["context_beyond_max_position_embeddings"] = arch::context_limit(s.spec).max_position_embeddings;
  }
  if (!s.unmeasured.empty()) {
    policy.calibration["extrapolated_levels"] = s.unmeasured;
    policy.calibration["extrapolation"] = r.extrapolate;
  }
  std::optional<KeepRuleResult> rules;
  if (s.selecting) {
    KeepRuleOptions ko;
    ko.memory = s.mem;
    ko.budget_bytes = s.budget;
    ko.prefill_chunk = r.prefill_chunk;
    ko.micro_batch = micro_batch;
    ko.activations = options.activations;
    ko.conditioned = options.conditioned;
    ko.divergence = answer_divergence(s.measure);
    ko.span = span.get();
    rules = span ? choose_keep_rules(*model, shard_sequences, shard_answers, result.windows, ko)
                 : choose_keep_rules(*model, s.data.sequences, s.data.answer_positions, result.windows, ko);
    policy.calibration["keep_rules"] = s.keep_rules;
    policy.calibration["prefill_chunk"] = r.prefill_chunk;
  }
  for (const auto& [layer_id, windows] : result.windows) {
    if (rules) {
      policy.per_layer_policies.push_back(
          {layer_id, rules->windows.at(layer_id), result.expected_distortion.at(layer_id), rules->rules.at(layer_id)});
    } else {
      policy.per_layer_policies.push_back({layer_id, windows, result.expected_distortion.at(layer_id), {}});
    }
  }
  policy::fill_memory(policy, s.spec);
  HEADWISE_CHECK(policy.memory.total_bytes <= s.budget, "policy total {} exceeds budget {}", policy.memory.total_bytes,
                 s.budget);
  out.policy_yaml = policy::to_yaml(policy);
  out.seconds = result.total_seconds;

  report::ReportContext context{policy.model_name, s.mem.context, s.budget, s.fixed, policy.memory.total_bytes,
                                policy.memory.full_kv_total_bytes, s.ladder, policy.calibration, memory_plan};
  if (control.want_report) {
    nlohmann::json report = report::calibration_report(result, context);
    report["world_size"] = world.world_size();
    if (rules) report["keep_rules"] = keep_rules_json(*rules);
    report["backend"] = world.backend();
    if (world.world_size() > 1) {
      report["distributed"] = {{"rank_sequences", result.local_sequences},
                               {"micro_batch", micro_batch},
                               {"exchanged_bytes", result.exchanged_bytes}};
    }
    out.report_json = report.dump(2) + "\n";
  }
  if (control.want_plot) {
    // The policy's heads as served: an h2o head's slots where the pass cut them, marked.
    out.svg = report::window_heatmap_svg(s.spec, rules ? rules->windows : result.windows, s.ladder,
                                         fmt::format("{}: KV-head windows at {} tokens, {} of the {} budget",
                                                     policy.model_name, format_tokens(s.mem.context),
                                                     format_bytes(policy.memory.total_bytes), format_bytes(s.budget)),
                                         rules ? rules->rules : std::map<int64_t, std::vector<policy::KeepRule>>{});
  }
  return out;
}

}  // namespace headwise::calib
