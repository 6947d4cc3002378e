// The main command's calibration as a library job, so the CLI and `regen` run exactly the same
// code.
#include "headwise/calib/calibration_job.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "calib/job/auto_samples.hpp"
#include "calib/job/input_checks.hpp"
#include "calib/job/job_state.hpp"
#include "calib/job/policy_assembly.hpp"
#include "calib/job/post_walk_fits.hpp"
#include "calib/rules/joint_rules.hpp"
#include "headwise/arch/context_guard.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/answer_span.hpp"
#include "headwise/calib/calibration_data.hpp"
#include "headwise/calib/engine.hpp"
#include "headwise/calib/keep_rules.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/calib/memory_plan.hpp"
#include "headwise/calib/prompt_end.hpp"
#include "headwise/calib/resume_checkpoint.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/calib/tensor_parallel.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/core/resources.hpp"
#include "headwise/core/units.hpp"
#include "headwise/core/window.hpp"
#include "headwise/io/checkpoint.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/memory/tensor_parallel.hpp"

namespace headwise::calib {
namespace {
namespace fs = std::filesystem;

// Bumped whenever the same inputs can give another policy (the measure, the descent, the
// completion changed): see calibration_revisions.
//   2: lambda-priced joint descent, re-walks after the completion (2026-12-01).
constexpr int64_t kCalibrationRevision = 2;
// The same for the walk under --tensor-parallel-size > 1, hashed only there.
//   1: the shard-constrained walk and fit (calib/tensor_parallel.hpp), which changed the TP
//      policies after revision 2 without a bump (2026-12-06: a TP policy written before this is
//      recalibrated by a plain regen; no committed policy is TP).
constexpr int64_t kTensorParallelRevision = 1;
// The same for --decisions stable, hashed only there.
//   1: the keep rules decided by their effect alone, the windows second in the order
//      (noise::worse_by_effect, 2026-12-06: a stable policy written before, whose keep rules the
//      t- and sign tests decided and which has no decision_noise key, is recalibrated by a
//      plain regen; no committed policy is stable).
constexpr int64_t kStableDecisionsRevision = 1;

// model_path is read relative to the policy's own folder (mem-estimate, regen), so policies
// committed next to a model keep working from any checkout.
std::string model_path_for(const fs::path& model_dir, const fs::path& policy_path) {
  const fs::path policy_dir = fs::absolute(policy_path).parent_path();
  return fs::absolute(model_dir)
      .lexically_normal()
      .lexically_relative(policy_dir.lexically_normal())
      .string();
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

// The label a library parser (dtype, context guard) puts in its messages for `field`.
template <typename Parse>
auto parse_labelled(std::string_view field, Parse&& parse) {
  try {
    return parse(field_ref(field));
  } catch (const FieldError&) {
    throw;
  } catch (const InputError& e) {
    throw FieldError(std::string(field), e.what());
  }
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

std::vector<int64_t> unmeasured_levels(const std::vector<int64_t>& levels, int64_t seq_len,
                                       int64_t context) {
  std::vector<int64_t> blind;
  for (int64_t w : levels) {
    if (w != kFullWindow && w >= seq_len && w < context) blind.push_back(w);
  }
  return blind;
}

nlohmann::json calibration_revisions(const CalibrationOptions& resolved) {
  nlohmann::json out{{"calibration_revision", kCalibrationRevision}};
  if (resolved.tensor_parallel_size > 1) out["tensor_parallel_revision"] = kTensorParallelRevision;
  if (resolved.decisions == "stable") out["stable_decisions_revision"] = kStableDecisionsRevision;
  return out;
}

fs::path checkpoint_path_for(const fs::path& output) {
  return fs::path(output.string() + ".ckpt.json");
}

namespace {

// The field that sets how many sequences the run loads and plans for, as a refusal names it: the
// cap under --samples auto (its largest round is loaded and planned before the first, and is what
// the user can lower), --samples otherwise.
std::string_view samples_field(const CalibrationJob::State& s) {
  return s.auto_samples ? "samples_cap" : "samples";
}

// The calibration data of `samples` sequences, with the answer positions every trial of the run
// is measured at. The built-in set draws its sequences one after another from the seed, and a file
// is packed in its records' order, so fewer sequences are a prefix of more: a round of
// --samples auto adds sequences to the ones before, and draws the fixed-N run's sequences.
CalibrationData load_job_data(const CalibrationJob::State& s, int64_t samples) {
  const CalibrationOptions& o = s.options;
  CalibrationData data =
      load_calibration_data(o.calib, s.dir, s.spec.vocab_size, samples, *o.seq_len, o.seed,
                            option_spelling(samples_field(s)), o.needles.value_or(0));
  // A rule that chooses at the prompt's end is measured after it, and so is every trial of the
  // run, the walk's included: all are compared on the same positions (prompt_end.hpp).
  if (chooses_at_prompt_end(s.rules)) {
    data.answer_positions = answers_after_prompt_end(data.answer_positions, o.follow_ups);
    data.answer_rule +=
        o.follow_ups == 0
            ? ", after the prompt end (each sequence's last run of answer positions)"
            : fmt::format(
                  ", after the prompt end (each sequence's last {} runs of answer positions: the "
                  "question in the prompt and {} asked after it)",
                  o.follow_ups + 1, o.follow_ups);
  }
  return data;
}

// Everything that can change a byte of the policy: the options' kHashed fields
// (calibration_options.hpp) and what stands for the model and the data.
nlohmann::json hashed_inputs(const CalibrationJob::State& s, const nlohmann::json& options) {
  nlohmann::json inputs = options;
  inputs["tool"] = fmt::format("headwise-calc {}", HEADWISE_VERSION);
  inputs.update(calibration_revisions(s.options));
  inputs["model_config_sha256"] = s.fingerprint.config_sha256;
  inputs["model_weights_headers_sha256"] = s.fingerprint.weights_headers_sha256.value_or("");
  inputs["model_path"] = s.model_path;
  inputs["dataset"] = s.data.description;
  inputs["dataset_sha256"] = s.data.sha256;
  return inputs;
}

}  // namespace

CalibrationJob::CalibrationJob(const CalibrationOptions& options, const fs::path& output)
    : state_(new State) {
  State& s = *state_;
  s.options = options;
  CalibrationOptions& o = s.options;
  const ServingEngine engine = parse_serving_engine(o.engine);
  if (engine == ServingEngine::kVllm && o.tensor_parallel_size > 1) {
    throw_field_error("engine",
                      " vllm: a budget in vLLM's bytes is fitted for one rank's whole layers only; "
                      "drop {} or {}",
                      field_ref("tensor_parallel_size"), field_ref("engine"));
  }
  if (o.tensor_parallel_size < 1) {
    throw_field_error("tensor_parallel_size", ": must be positive, got {}", o.tensor_parallel_size);
  }
  if (o.tensor_parallel_size > 1) {
    // A policy that shards is for vLLM, which serves window rules only.
    if (o.keep_rules == "auto") o.keep_rules = "window";
    if (o.keep_rules != "window") {
      throw_field_error("keep_rules",
                        ": {} with --tensor-parallel-size {}: vLLM serves window rules only "
                        "(use --keep-rules window)",
                        o.keep_rules, o.tensor_parallel_size);
    }
  }
  o.keep_rules = engine_keep_rules(o.keep_rules, o.distortion, engine);
  s.rules = parse_keep_rules(o.keep_rules);
  s.output = output;
  s.dir = io::resolve_model_dir(o.model);
  s.spec = arch::load_model_spec(s.dir);
  if (o.tensor_parallel_size > 1) {  // the heads must split as vLLM shards them
    for (int64_t id : s.spec.global_layer_ids())
      memory::tensor_parallel_shards(s.spec.layer(id).attention->num_kv_heads,
                                     o.tensor_parallel_size);
  }

  s.mem.context = o.context;
  if (o.context > 0) {  // else validate_options names it
    s.context_warning = arch::check_context(s.spec, s.mem.context, option_spelling("context"),
                                            (s.dir / "config.json").string());
  }
  if (s.context_warning) spdlog::warn("{}", *s.context_warning);
  s.mem.batch = o.batch;
  s.mem.block_size = o.block_size;
  s.mem.sink_tokens = o.sink_tokens;
  s.mem.kv_dtype = o.kv_dtype.value_or(s.spec.dtype);
  o.kv_dtype = s.mem.kv_dtype;
  s.mem.state_dtype = o.state_dtype;
  memory::validate_options(s.mem);
  memory::VllmOptions vllm;
  vllm.max_num_batched_tokens = o.max_num_batched_tokens;
  s.engine.emplace(s.spec, s.mem, engine, vllm);  // sink tokens and the chunk checked for vllm
  HEADWISE_CHECK(!o.windows.levels.empty(), "an empty window ladder");
  const int64_t seq_len =
      o.seq_len ? *o.seq_len : auto_calibration_length(o.windows.levels, s.mem.context);
  if (seq_len <= 0) throw_field_error("seq_len", ": '{}' must be positive", seq_len);
  o.seq_len = seq_len;
  check_needles(o);
  check_measure_options(o, !s.rules.empty());
  check_prefill_peak(o, s.rules, s.spec.global_layer_ids().size());
  refuse_follow_ups_without_choice(o, s.rules);
  // Before the walk: a rule chosen with the levels is measured on the answer span only.
  if (offered_at_every_level(s.rules) && !measure_traits(o.distortion).runs_on_span) {
    throw_field_error("keep_rules",
                      " {}: snap is chosen jointly with the windows on the answer span; use a span "
                      "measure ({} answer-tv-span or answer-kl-span), not {}",
                      o.keep_rules, field_ref("distortion"), distortion_measure_name(o.distortion));
  }
  s.unmeasured = unmeasured_levels(o.windows.levels, seq_len, s.mem.context);
  refuse_unmeasured_levels(s.unmeasured, seq_len, o.extrapolate);
  check_samples(o);
  if (o.decisions != "point" && o.decisions != "stable")
    throw_field_error("decisions", ": '{}' is not point or stable", o.decisions);
  s.fixed = s.engine->fixed();
  if (engine == ServingEngine::kVllm)
    refuse_budget_below_engine_minimum(*s.engine, o.windows.levels, o.budget);
  else
    refuse_budget_below_minimum(s.spec, s.mem, s.fixed, o);
  // auto: the cap's sequences, so that data too short for the cap is refused before any round;
  // the hash covers that stream (and the cap), each round a prefix of it (run_auto).
  s.auto_samples = !o.samples;
  s.data = load_job_data(s, o.samples.value_or(o.samples_cap));
  if (o.samples) o.samples = static_cast<int64_t>(s.data.sequences.size());
  s.fingerprint = policy::fingerprint_model(s.dir);
  s.model_path = model_path_for(s.dir, output);
  s.inputs.options = hashed_options(o);
  s.inputs.hash = sha256_hex(hashed_inputs(s, s.inputs.options).dump());
}

CalibrationJob::~CalibrationJob() = default;

const std::string& CalibrationJob::inputs_hash() const {
  return state_->inputs.hash;
}

namespace {

// The run's shape on this rank: its micro-batch and its share of the sequences.
struct RankShare {
  int64_t micro_batch = 0;
  std::vector<size_t> sequences;  // indices into the calibration data
};

RankShare rank_share(const CalibrationJob::State& s, const dist::Collective& world) {
  RankShare share;
  share.micro_batch = effective_micro_batch(s.options.micro_batch,
                                            static_cast<int64_t>(s.data.sequences.size()), world);
  share.sequences = dist::shard_sequences(s.data.sequences.size(), share.micro_batch, world.rank(),
                                          world.world_size());
  return share;
}

std::unique_ptr<arch::DecoderModel> load_job_model(const CalibrationJob::State& s,
                                                   const dist::Collective& world, int local_rank) {
  const CalibrationOptions& r = s.options;
  arch::ModelOptions model_options;
  model_options.device = rank_device(r.device, world, local_rank);
  model_options.attention_chunk = r.attention_chunk;
  if (!r.dtype.empty()) {
    model_options.compute_dtype = parse_labelled(
        "dtype", [&](const std::string& label) { return parse_dtype(r.dtype, label); });
  }
  return arch::load_model(s.dir, model_options);
}

// Plans the calibration's memory and refuses a run that cannot fit; the plan's JSON for the report.
MemoryPlan plan_memory(const CalibrationJob::State& s, arch::DecoderModel& model,
                       const RankShare& share) {
  const CalibrationOptions& r = s.options;
  CalibrationShape shape{static_cast<int64_t>(share.sequences.size()),
                         *r.seq_len,
                         share.micro_batch,
                         r.attention_chunk,
                         static_cast<int64_t>(r.windows.size()),
                         static_cast<int64_t>(c10::elementSize(model.dtype()))};
  shape.answer_span = measure_traits(r.distortion).runs_on_span;
  if (r.conditioned) shape.stream_checkpoint_limit_bytes = kStreamCheckpointLimitBytes;
  const bool cpu = model.device().is_cpu();
  std::optional<int64_t> available =
      cpu ? available_host_bytes() : free_device_bytes(model.device());
  if (r.memory_limit) available = std::min(available.value_or(*r.memory_limit), *r.memory_limit);
  const MemoryPlan plan =
      plan_calibration_memory(s.spec, model.checkpoint(), shape,
                              cpu || r.activations != ActivationPlacement::kHost, available);
  refuse_if_it_cannot_fit(plan, samples_field(s), r.memory_limit && available == r.memory_limit);
  return plan;
}

SeqCalibOptions seqcalib_options(const CalibrationJob::State& s, const MemoryPlan& plan,
                                 const RankShare& share) {
  const CalibrationOptions& r = s.options;
  SeqCalibOptions options;
  options.ladder = r.windows;
  options.global_budget_bytes = r.budget - s.fixed;
  options.sink_tokens = r.sink_tokens;
  options.head_bytes = s.engine->head_fn();
  options.micro_batch = share.micro_batch;
  options.probe_samples = r.probe_samples;
  options.measured_layer_resident = plan.measured_layer_resident;
  options.conditioned = r.conditioned;
  options.measure = r.distortion;
  options.answer_positions = s.data.answer_positions;
  options.joint_heads = r.joint_heads;
  options.resolve_by_rewalk = r.re_solve == ReSolve::kRewalk;
  options.span_margin = r.span_margin;
  options.validate_measure = r.validate_measure;
  options.unmeasured_levels = s.unmeasured;
  options.extrapolation = r.extrapolate;
  options.activations = r.activations;
  options.stable_decisions = r.decisions == "stable";
  options.tensor_parallel_size = r.tensor_parallel_size;
  return options;
}

// The answer-span measure's reference forward, on this rank's shard: SeqCalib and the keep-rules
// pass both measure with it.
struct ShardSpan {
  std::unique_ptr<AnswerSpan> span;
  std::vector<std::vector<int64_t>> sequences, answers;
};

ShardSpan answer_span_on_shard(const CalibrationJob::State& s, arch::DecoderModel& model,
                               const SeqCalibOptions& options, const RankShare& share,
                               dist::Collective& world) {
  ShardSpan out;
  for (size_t i : share.sequences) {
    out.sequences.push_back(s.data.sequences[i]);
    out.answers.push_back(s.data.answer_positions.at(i));
  }
  spdlog::info("{}: full-KV reference and the answer span's caches ({} sequences)",
               distortion_measure_name(s.options.distortion), out.sequences.size());
  out.span = std::make_unique<AnswerSpan>(model, out.sequences, out.answers,
                                          answer_span_options(options), world);
  return out;
}

// What a round measured on this rank: the walk, with the fits to the engine and to tensor
// parallelism that follow it. The keep rules and the policy come after (finish).
struct Walked {
  RankShare share;
  nlohmann::json memory_plan;
  SeqCalibOptions options;
  ShardSpan shard;
  SeqCalibResult result;
  std::optional<TensorParallelFit> tensor_parallel;
  std::optional<EngineFitRecord> engine_fit;
};

// The walk's checkpoint after each global layer, written by rank 0 where the caller asked for one.
void write_checkpoints(const CalibrationJob::State& s, const RunControl& control,
                       const dist::Collective& world, SeqCalibOptions& options) {
  if (world.rank() != 0 || control.checkpoint.empty()) return;
  options.checkpoint = [&s, path = control.checkpoint](const ResumeCheckpoint& state) {
    write_file_atomically(path, checkpoint_file_text(s.inputs, state));
  };
}

Walked walk(const CalibrationJob::State& s, arch::DecoderModel& model, const RunControl& control,
            ResumeCheckpoint* resume, dist::Collective& world, int64_t rss_before_model) {
  const CalibrationOptions& r = s.options;
  Walked w;
  w.share = rank_share(s, world);
  const MemoryPlan plan = plan_memory(s, model, w.share);
  w.memory_plan = plan.to_json();
  w.memory_plan["rss_before_model_bytes"] = rss_before_model;
  spdlog::info(
      "calibrating {} ({} layers, {} global) on {} sequences x {} tokens, ladder {}, budget {} ({} "
      "fixed)",
      s.dir.string(), s.spec.num_layers(), s.spec.global_layer_ids().size(),
      s.data.sequences.size(), *r.seq_len, r.windows.to_string(), format_bytes(r.budget),
      format_bytes(s.fixed));
  w.options = seqcalib_options(s, plan, w.share);
  w.options.resume = resume;
  w.options.collective = &world;
  write_checkpoints(s, control, world, w.options);
  if (measure_traits(r.distortion).runs_on_span) {
    w.shard = answer_span_on_shard(s, model, w.options, w.share, world);
    w.options.span = w.shard.span.get();
  }
  w.result = run_seqcalib(model, s.data.sequences, w.options);
  if (s.engine->engine() == ServingEngine::kVllm) w.engine_fit = fit_to_vllm(s, w.result);
  if (r.tensor_parallel_size > 1) w.tensor_parallel = fit_to_shards(s, w.result);
  return w;
}

std::optional<KeepRuleResult> keep_rules(const CalibrationJob::State& s, arch::DecoderModel& model,
                                         const Walked& w, const dist::Collective& world) {
  if (s.rules.empty()) return std::nullopt;
  const CalibrationOptions& r = s.options;
  KeepRuleOptions ko;
  ko.rules = s.rules;
  ko.memory = s.mem;
  ko.budget_bytes = r.budget;
  ko.prefill_chunk = r.prefill_chunk;
  ko.micro_batch = w.share.micro_batch;
  ko.activations = w.options.activations;
  ko.conditioned = w.options.conditioned;
  ko.divergence = measure_traits(r.distortion).divergence;
  ko.span = w.shard.span.get();
  ko.stable_decisions = w.options.stable_decisions && world.world_size() == 1;
  ko.decision_noise = world.world_size() == 1;  // the bootstrap needs every sequence's values
  ko.prefill_peak = r.prefill_peak.value_or(0);
  ko.prefill_schedule =
      runtime::prefill_schedule_from_name(r.prefill_schedule, "--prefill-schedule");
  ko.follow_ups = r.follow_ups;
  return w.shard.span
             ? choose_keep_rules(model, w.shard.sequences, w.shard.answers, w.result.windows, ko)
             : choose_keep_rules(model, s.data.sequences, s.data.answer_positions, w.result.windows,
                                 ko);
}

// The keep rules over the walk's windows, then the policy and what the report shows.
CalibrationOutcome finish(const CalibrationJob::State& s, arch::DecoderModel& model, Walked w,
                          const dist::Collective& world) {
  std::optional<KeepRuleResult> rules = keep_rules(s, model, w, world);
  CalibrationOutcome out;
  out.policy = assemble_policy(s, w.result, rules, w.shard.span.get());
  out.policy_yaml = policy::to_yaml(out.policy);
  out.seconds = w.result.total_seconds;

  CalibrationRecord& record = out.record;
  record.spec = s.spec;
  record.ladder = s.options.windows;
  record.context = s.mem.context;
  record.budget_bytes = s.options.budget;
  record.fixed_bytes = s.fixed;
  record.result = std::move(w.result);
  record.keep_rules = std::move(rules);
  record.memory_plan = std::move(w.memory_plan);
  record.world_size = world.world_size();
  record.backend = world.backend();
  record.micro_batch = w.share.micro_batch;
  record.tensor_parallel = std::move(w.tensor_parallel);
  record.engine_fit = w.engine_fit;
  return out;
}

// --samples auto reads every walked layer's decision noise after a round and re-runs the whole
// calibration, not the unseparated layers alone: a layer's walk is conditioned on the layers below
// and prices the layers above, so every layer must see the same sequences for the stream to stay
// one calibration (and the policy to be the fixed-N run's). A distributed run computes no
// decision noise (each rank holds its shard's values), and the rounds keep no checkpoint (a
// resumed run could not tell which round it stopped in).
void refuse_auto_samples_where_unsupported(const RunControl& control,
                                           const dist::Collective& world) {
  if (world.world_size() > 1) {
    throw_field_error("samples",
                      " auto reads each layer's decision noise, which a distributed run does not "
                      "compute; give {} N",
                      field_ref("samples"));
  }
  if (control.resume) {
    throw_input_error("{}: not with {} auto (its rounds keep no checkpoint)",
                      option_spelling("resume"), option_spelling("samples"));
  }
}

// Points the job's data and options at a round of `samples` sequences (a prefix of the cap's).
void use_samples(CalibrationJob::State& s, int64_t samples) {
  s.data = load_job_data(s, samples);
  s.options.samples = samples;
  s.rounds.push_back(samples);
}

// The largest round the cap allows must fit in memory: refused before the first round, not after
// a round that fit.
void refuse_cap_beyond_memory(CalibrationJob::State& s, arch::DecoderModel& model,
                              const dist::Collective& world) {
  s.data = load_job_data(s, s.options.samples_cap);
  plan_memory(s, model, rank_share(s, world));
}

// The rounds of --samples auto (auto_samples.hpp); the keep rules run on the last round's walk.
CalibrationOutcome run_auto(CalibrationJob::State& s, arch::DecoderModel& model,
                            dist::Collective& world, int64_t rss_before_model) {
  refuse_cap_beyond_memory(s, model, world);
  s.rounds.clear();
  double seconds = 0.0;
  for (int64_t samples = kAutoFirstSamples;;) {
    use_samples(s, samples);
    Walked w = walk(s, model, RunControl{}, nullptr, world, rss_before_model);
    seconds += w.result.total_seconds;
    const std::optional<int64_t> next =
        next_samples(w.result.decision_noise, samples, s.options.samples_cap);
    spdlog::info("{} auto: round {} at {} sequences: {}; {}", option_spelling("samples"),
                 s.rounds.size(), samples, unseparated_summary(w.result.decision_noise),
                 next ? fmt::format("next round at {} (cap {})", *next, s.options.samples_cap)
                      : fmt::format("keeping {} (cap {})", samples, s.options.samples_cap));
    if (next) {
      samples = *next;
      continue;
    }
    CalibrationOutcome out = finish(s, model, std::move(w), world);
    out.seconds = seconds;  // every round's walk
    return out;
  }
}

}  // namespace

CalibrationOutcome CalibrationJob::run(const RunControl& control) {
  State& s = *state_;
  dist::Collective& world =
      control.collective != nullptr ? *control.collective : dist::single_process();
  refuse_ranks_with_other_inputs(world, s.inputs.hash);
  if (s.auto_samples) refuse_auto_samples_where_unsupported(control, world);
  std::optional<ResumeCheckpoint> resume;
  if (control.resume && !control.checkpoint.empty())
    resume = shared_checkpoint(world, control.checkpoint, s.inputs);
  if (world.rank() == 0 && !control.resume && !control.checkpoint.empty() &&
      fs::exists(control.checkpoint)) {
    spdlog::warn("{} exists and will be replaced: pass {} to continue that run instead",
                 control.checkpoint.string(), option_spelling("resume"));
  }

  const int64_t rss_before_model = current_rss_bytes();
  auto model = load_job_model(s, world, control.local_rank);
  if (s.auto_samples) return run_auto(s, *model, world, rss_before_model);
  Walked w = walk(s, *model, control, resume ? &*resume : nullptr, world, rss_before_model);
  return finish(s, *model, std::move(w), world);
}

}  // namespace headwise::calib
