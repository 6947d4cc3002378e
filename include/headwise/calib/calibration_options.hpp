#pragma once
// The main command's options, written once. CalibrationOptions holds every option of a
// calibration as a typed member; visit_fields() lists each member once, with its name and what
// it is used for, and everything that handles options walks that list (the way gemma.cpp's
// VisitFields serves its configs):
//   - the command line's flags (cli/calibration_options.cpp: one CLI11 option per field) and the
//     keys of a regen manifest entry (regen/manifest.cpp), both into a CalibrationRequest (text);
//   - parse_calibration_options(): request -> options, each text through its type's parser, with
//     the flag named in the error;
//   - the inputs hash (hashed_options), policy.calibration (record_options) and the resume
//     checkpoint's check (changed_options), in calibration_job.cpp.
//
// ADDING AN OPTION: one member in CalibrationOptions and one line in visit_fields() (name, help,
// uses). A member of a type no option has yet also needs its parse/json/text overloads in
// src/calib/job/calibration_options.cpp. Then pass the value to whatever runs it. An option that
// can change a byte of the policy must be kHashed (so `regen` and `--resume` see it change); one
// whose value a deployer should see is kRecorded. docs/development.md says the same.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/calib/answer_reference.hpp"
#include "headwise/calib/extrapolation.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/dtype.hpp"
#include "headwise/measure/window_ladder.hpp"

namespace headwise::calib {

struct CalibrationOptions;

// What a field is used for (Field::use, bits).
enum FieldUse : unsigned {
  kRequired = 1u << 0,  // the command line and a manifest entry must give it
  kManifestRequired =
      1u << 1,             // a manifest entry must give it (the recipe must not lean on defaults)
  kHashed = 1u << 2,       // in inputs_sha256: it can change a byte of the policy
  kRecorded = 1u << 3,     // in the policy's provenance (policy.calibration)
  kPath = 1u << 4,         // a file or folder: a manifest reads it relative to its own folder
  kHideDefault = 1u << 5,  // --help does not print the default (its text says what it means)
};

// How a field's text reads, where its type alone does not say.
enum class Syntax {
  kPlain,
  kTokens,      // 160k = 163840 tokens (units.hpp: parse_token_count)
  kBytes,       // 48g (units.hpp: parse_byte_size)
  kStateDType,  // float32, bfloat16, float16 (policy.hpp: parse_state_dtype)
};

// The re-solve check of the span measures (SeqCalibOptions::resolve_by_rewalk): "span" or "rewalk".
enum class ReSolve { kSpan, kRewalk };

// One field's name and metadata. Every member but name and help has a default that fits a plain
// option: its flag is --kebab-case of the name, its manifest key, hash key and provenance key are
// the name, and its JSON is its value's (resolved: see CalibrationJob).
struct Field {
  using Condition = bool (*)(const CalibrationOptions& resolved);
  using Value = nlohmann::json (*)(const CalibrationOptions& resolved);

  std::string_view name;  // the field's id (FieldError, core/error.hpp) and manifest key
  std::string_view help;  // the command line's help
  unsigned use = 0;       // FieldUse bits
  Syntax syntax = Syntax::kPlain;
  // For std::optional members: the text that means "not set" (seq_len auto, state_dtype native).
  std::string_view unset = {};
  std::string_view flag = {};  // the command line's flag when not --kebab-case of the name
  // A command-line switch (no value) that sets the field to this text; bool fields: "true".
  std::string_view switch_sets = {};
  std::string_view hash_key = {};    // its key in inputs_sha256 (default: name)
  std::string_view record_key = {};  // its key in policy.calibration (default: name); "a/b" nests
  Condition when = nullptr;          // hashed and recorded only when this holds (default: always)
  Condition record_when = nullptr;   // recorded only when this holds (default: `when`)
  Value record_value = nullptr;      // what policy.calibration records (default: the hashed JSON)
};

namespace field_conditions {
bool on_span(const CalibrationOptions& o);               // an answer-span measure
bool scores_answers(const CalibrationOptions& o);        // an answer measure
bool selecting_keep_rules(const CalibrationOptions& o);  // a rule besides window (resolved)
bool extrapolates(const CalibrationOptions& o);          // some ladder level is left unmeasured
bool auto_samples(const CalibrationOptions& o);          // --samples auto
nlohmann::json effective_probe_samples(const CalibrationOptions& o);
nlohmann::json measure_provenance(const CalibrationOptions& o);
nlohmann::json method(const CalibrationOptions& o);  // seqcalib or unconditioned
nlohmann::json heads(const CalibrationOptions& o);   // joint or independent
}  // namespace field_conditions

// Every option that shapes a calibration, typed, with the main command's defaults.
struct CalibrationOptions {
  std::string model;    // folder (config.json + safetensors) or cached HF repo id
  int64_t context = 0;  // tokens
  int64_t budget = 0;   // bytes, for the whole request batch
  measure::WindowLadder windows = default_windows();
  std::string calib;  // empty: the built-in synthetic set
  // nullopt: auto, the sequential rule (calib/job/auto_samples.hpp) chooses it, up to samples_cap.
  std::optional<int64_t> samples = 8;
  int64_t samples_cap = 32;        // with samples auto: the most sequences the rule may draw
  std::optional<int64_t> seq_len;  // nullopt: auto_calibration_length
  // The built-in set's needles per sequence; nullopt: the set's own default (one per 512 tokens,
  // 1 to 8). The data's description and sha256 carry it into the hash.
  std::optional<int64_t> needles;
  // answer-tv-span: answer TV (what wins on retrieval accuracy, see AnswerDivergence) measured on
  // the answer span, at a cost flat in depth (answer_span.hpp); answer-tv is the exact measure.
  DistortionMeasure distortion = DistortionMeasure::kAnswerTvSpan;
  int64_t span_margin = 8;  // answer-span measures: tokens of the span before the first answer
  ReSolve re_solve = ReSolve::kSpan;
  bool joint_heads = true;  // false: --independent-heads, the ablation of the joint decision
  // answer-grad / answer-*-span against the exact measure, in the report.
  bool validate_measure = false;
  Extrapolation extrapolate = Extrapolation::kNone;  // the rule for levels the sequences miss
  // "auto", or a list of registered keep rules with window ("window", "window,h2o") as written;
  // the job resolves it (keep_rules.hpp: resolve_keep_rules) before anything reads it.
  std::string keep_rules = "auto";
  // With snap: the most bytes the policy may hold during prefill (nullopt: no bound), and the
  // schedule of that prefill, "whole" or "layer" (runtime/decoder.hpp: PrefillSchedule).
  std::optional<int64_t> prefill_peak;
  std::string prefill_schedule = "whole";
  // "point" (the least measured value decides) or "stable" (issue 59: where the sequences do not
  // separate the candidates, a fixed order of preference does; docs/seqcalib.md).
  std::string decisions = "point";
  // With snap: answer runs measured as questions asked after the snap heads chose (prompt_end.hpp).
  int64_t follow_ups = 0;
  int64_t prefill_chunk = 256;  // with h2o: the runtime's prefill chunk (H2O evicts after each)
  int64_t block_size = 16;
  int64_t batch = 1;
  int64_t sink_tokens = 0;
  // Whose bytes the budget counts (calib/engine.hpp): "headwise" (its runtime and transformers'
  // cache) or "vllm" (vLLM's reservation for python/headwise_vllm's per-window groups).
  std::string engine = "headwise";
  // With engine vllm: vLLM's max_num_batched_tokens (memory::kVllmDefaultMaxNumBatchedTokens).
  int64_t max_num_batched_tokens = 8192;
  std::optional<DType> kv_dtype;  // nullopt: the checkpoint's
  // The dtype the serving cache keeps recurrent/conv states in (policy.yaml's state_dtype):
  // float32 by default, so the runtime decoder computes what calibration measured (the plain
  // forward) whatever the prefill chunking; nullopt (native) = each state's own dtype (policies
  // made before the option; no state_dtype field). See docs/memory.md.
  std::optional<DType> state_dtype = DType::kFloat32;
  uint64_t seed = 0;
  std::string device = "cpu";  // cpu, cuda or cuda:N (the model loader reads it)
  // Compute dtype as written (the inputs hash records this text); empty: the device's default.
  std::string dtype;
  int64_t micro_batch = 0;  // 0: every sequence at once (distributed: each rank's share)
  int64_t probe_samples = 0;
  int64_t attention_chunk = 512;
  ActivationPlacement activations = ActivationPlacement::kAuto;
  // The most memory the run may plan for (host on CPU, the device's on CUDA); nullopt: what is
  // free (the cgroup's limit included). A shared machine's user leaves room for other jobs.
  std::optional<int64_t> memory_limit;
  bool conditioned = true;  // false: --no-conditioning, the ablation baseline
  // vLLM's tensor_parallel_size the windows must shard over (calib/tensor_parallel.hpp); 1: none.
  int64_t tensor_parallel_size = 1;

  static measure::WindowLadder default_windows();
};

// Every field once, in the command line's order. `Options` is CalibrationOptions, const or not;
// `visit(member, field)` is called for each member with its metadata.
template <class Options, class Visitor>
void visit_fields(Options& o, Visitor&& visit) {
  namespace c = field_conditions;
  visit(o.model, {.name = "model",
                  .help = "Model folder (config.json + safetensors) or cached HF repo id",
                  .use = kRequired | kPath | kHideDefault});
  visit(o.context, {.name = "context",
                    .help = "Context length to serve, tokens (k = 1024: 160k = 163840)",
                    .use = kRequired | kHashed | kHideDefault,
                    .syntax = Syntax::kTokens});
  visit(o.budget, {.name = "budget",
                   .help = "Cache budget for the whole request batch (g = GiB: 48g)",
                   .use = kRequired | kHashed | kHideDefault,
                   .syntax = Syntax::kBytes,
                   .hash_key = "budget_bytes"});
  visit(o.windows, {.name = "windows",
                    .help = "Window ladder, ascending; 'full' = untruncated",
                    .use = kManifestRequired | kHashed});
  visit(o.calib,
        {.name = "calib",
         .help = "Calibration JSONL ({\"text\": ...} or {\"input_ids\": [...]}); default: built-in "
                 "synthetic retrieval set",
         .use = kPath | kHideDefault});  // hashed as the data's description and sha256
  visit(o.samples, {.name = "samples",
                    .help = "Calibration sequences; auto: 8, then more (the whole calibration "
                            "again, up to --samples-cap) while a layer's decision is not separated "
                            "and would be within the cap (docs/seqcalib.md)",
                    .use = kHashed | kRecorded,
                    .unset = "auto"});
  // Hashed only with --samples auto, so that every other policy keeps its hash; the policy
  // records it beside the rounds (calibration_job.cpp: provenance).
  visit(o.samples_cap,
        {.name = "samples_cap",
         .help = "With --samples auto: the most calibration sequences the rule may draw (8 or "
                 "more)",
         .use = kHashed,
         .when = c::auto_samples});
  visit(o.seq_len, {.name = "seq_len",
                    .help = "Tokens per calibration sequence; auto: the largest finite --windows "
                            "level below --context plus a quarter (at least 2k), so every level "
                            "is measured",
                    .use = kHashed | kRecorded,
                    .syntax = Syntax::kTokens,
                    .unset = "auto"});
  // Not hashed: the data's description and sha256 are (hashed_inputs), so an explicit --needles
  // equal to the auto value keeps the policy's hash.
  visit(o.needles, {.name = "needles",
                    .help = "Needles (key-value pairs, each queried at the sequence's end) per "
                            "sequence of the built-in calibration set; auto: one per 512 tokens, 1 "
                            "to 8. More needles average each sequence over more depths at no "
                            "extra forward, and change what the calibration measures "
                            "(docs/seqcalib.md: \"More needles per sequence\")",
                    .unset = "auto"});
  visit(o.distortion,
        {.name = "distortion",
         .help = "What a window costs: answer-tv-span (total variation to the full model's "
                 "next-token distribution at the answer positions, heads of a layer decided "
                 "jointly; each candidate runs on the answer span against the layers' cached "
                 "prompt, so its cost does not grow with depth: docs/seqcalib.md), answer-kl-span "
                 "(the same with KL), answer-tv (the exact measure: the layers above run over "
                 "every token for each candidate), answer-kl (the same with KL, which a lost "
                 "needle dominates), answer-grad (the KL predicted to second order from "
                 "gradients: one backward pass per probe instead of a run per assignment) or "
                 "block-mse (the attention block's output error over all positions)",
         .use = kHashed | kRecorded,
         .record_key = "distortion_measure",
         .record_value = c::measure_provenance});
  visit(o.span_margin, {.name = "span_margin",
                        .help = "answer-*-span: tokens before the first answer position that the "
                                "span measure also runs exactly (the question's own tokens and "
                                "context before it)",
                        .use = kHashed | kRecorded,
                        .record_key = "answer_span/margin",
                        .when = c::on_span});
  visit(o.re_solve, {.name = "re_solve",
                     .help = "answer-*-span: after the cross-layer re-solve, re-walk the layers "
                             "above the lowest layer it moves (one more walk of them, each "
                             "re-decided) instead of checking the re-solved policy on the answer "
                             "span (the default; its cost does not grow with depth)",
                     .use = kHashed | kRecorded,
                     .flag = "--re-solve-by-rewalk",
                     .switch_sets = "rewalk",
                     .record_key = "answer_span/re_solve",
                     .when = c::on_span});
  visit(o.joint_heads, {.name = "joint_heads",
                        .help = "answer-kl/answer-grad: decide a layer's heads from curves "
                                "measured with the other heads at full (the ablation of the joint "
                                "decision)",
                        .use = kHashed | kRecorded,
                        .flag = "--independent-heads",
                        .switch_sets = "false",
                        .record_key = "heads",
                        .record_when = c::scores_answers,
                        .record_value = c::heads});
  visit(o.validate_measure,
        {.name = "validate_measure",
         .help = "answer-grad, answer-*-span: also measure every probe (head, level) and each "
                 "layer's decision with the exact measure (and, for the span measures, the exact "
                 "measure's own decision) and report the prediction against it (report.json: "
                 "measure_validation)"});  // the report's only
  visit(o.extrapolate, {.name = "extrapolate",
                        .help = "Rule for --windows levels >= --seq-len: none (refuse), power-law "
                                "(each head's curve fitted over its measured levels, capped at the "
                                "largest) or as-full (read as full KV's cost)",
                        .use = kHashed | kRecorded,
                        .record_key = "extrapolation",
                        .record_when = c::extrapolates});
  visit(o.keep_rules,
        {.name = "keep_rules",
         .help = "What may fill a head's slots: window (its most recent tokens; any engine with "
                 "per-head windows can serve the policy) or window,h2o (each head whose slots "
                 "evict on the calibration data is also measured with H2O's heavy hitters, on the "
                 "conditioned stream through the runtime's own eviction code, and keeps whichever "
                 "costs the answers less; the layer's selection bookkeeping is paid from the "
                 "budget; any other registered rule is tried the same way). auto: window,h2o with "
                 "an answer measure, window with block-mse",
         .use = kHashed | kRecorded,
         // window-only policies keep the hash they were made with
         .when = c::selecting_keep_rules});
  // Hashed and recorded only with a bound, so that every other policy keeps its hash.
  visit(o.prefill_peak,
        {.name = "prefill_peak",
         .help = "With snap in --keep-rules: the most bytes the policy may hold during prefill "
                 "(m = MiB: 3m), as mem-estimate states its prefill peak under "
                 "--prefill-schedule with a --context-token prompt: the steady bytes plus what "
                 "its snap heads stage until they choose. The joint solve keeps it exactly, and "
                 "the budget too (at least --budget; none: no bound; docs/keep-rules.md)",
         .use = kHashed | kRecorded,
         .syntax = Syntax::kBytes,
         .unset = "none",
         .record_key = "prefill_peak/bound_bytes",
         .when = [](const CalibrationOptions& r) { return r.prefill_peak.has_value(); }});
  visit(o.prefill_schedule,
        {.name = "prefill_schedule",
         .help = "The prefill --prefill-peak bounds: whole (the prompt chunk by chunk through "
                 "every layer, every snap head staging it at once: headwise's runtime and "
                 "HeadwiseCache) or layer (each layer's snap heads choose right after it, one "
                 "layer's staging at a time: kvpress)",
         .use = kHashed | kRecorded,
         .record_key = "prefill_peak/schedule",
         .when = [](const CalibrationOptions& r) { return r.prefill_peak.has_value(); }});
  // Hashed and recorded only when not 0, so that every other policy keeps its hash.
  visit(o.follow_ups,
        {.name = "follow_ups",
         .help = "With snap in --keep-rules: questions asked after the snap heads chose (a "
                 "chain's next hop, a user's next turn) measured beside the one in the prompt: "
                 "each sequence's prompt ends at the first of its last 1 + N runs of answer "
                 "positions, and all of them are measured (0: the question in the prompt only; "
                 "docs/keep-rules.md)",
         .use = kHashed | kRecorded,
         .when = [](const CalibrationOptions& r) { return r.follow_ups != 0; }});
  // Hashed and recorded only when not point, so that every other policy keeps its hash.
  visit(o.decisions,
        {.name = "decisions",
         .help = "How a layer's windows and its heads' keep rules are chosen among the measured "
                 "candidates: point (the least measured divergence) or stable (answer-*-span: "
                 "a fixed order of preference decides what the data do not, the same under every "
                 "--seed: a layer's windows are the first candidate that a bootstrap over the "
                 "calibration sequences does not separate from the least, more of the layer's "
                 "bytes first and a lower head's longer window next; its keep rules are every "
                 "evicting head selecting, else every head at its window, whichever first "
                 "measures within 15% of the least trial, else the least; docs/seqcalib.md)",
         .use = kHashed | kRecorded,
         .when = [](const CalibrationOptions& r) { return r.decisions != "point"; }});
  visit(o.prefill_chunk, {.name = "prefill_chunk",
                          .help = "With h2o keep rules: tokens per prefill chunk the runtime will "
                                  "use (H2O evicts after each; eval's default)",
                          .use = kHashed | kRecorded,
                          .when = c::selecting_keep_rules});
  visit(
      o.block_size,
      {.name = "block_size", .help = "Paged-cache block in tokens (1 = unpaged)", .use = kHashed});
  visit(o.batch, {.name = "batch", .help = "Sequences served at once", .use = kHashed});
  visit(o.sink_tokens,
        {.name = "sink_tokens", .help = "First tokens every windowed head keeps", .use = kHashed});
  // Hashed and recorded only for vllm, so that every other policy keeps its hash.
  visit(o.engine,
        {.name = "engine",
         .help = "Whose bytes --budget counts: headwise (its runtime and transformers' cache) or "
                 "vllm (what vLLM reserves serving the policy through python/headwise_vllm: each "
                 "window's reservation with --max-num-batched-tokens, vLLM's block rounding and "
                 "page sizes; window rules only, no sink tokens; docs/deploy.md)",
         .use = kHashed | kRecorded,
         .when = [](const CalibrationOptions& r) { return r.engine != "headwise"; }});
  visit(o.max_num_batched_tokens,
        {.name = "max_num_batched_tokens",
         .help = "With --engine vllm: vLLM's max_num_batched_tokens (a sliding group reserves its "
                 "window plus this many tokens; vLLM's default is 8192 on >= 70 GiB GPUs, 2048 "
                 "on smaller ones)",
         .use = kHashed | kRecorded,
         .syntax = Syntax::kTokens,
         .when = [](const CalibrationOptions& r) { return r.engine != "headwise"; }});
  visit(o.kv_dtype, {.name = "kv_dtype",
                     .help = "KV cache dtype (default: the checkpoint's)",
                     .use = kHashed | kHideDefault});
  // Hashed only when not native (nullopt is left out), so that policies made before
  // --state-dtype keep the hash they were made with.
  visit(o.state_dtype,
        {.name = "state_dtype",
         .help = "dtype the serving cache keeps every recurrent/conv state in (policy's "
                 "state_dtype; its bytes follow it): float32 (default: the runtime then computes "
                 "the model calibration measured, whatever the prefill chunking), bfloat16, "
                 "float16, or native (each state's own dtype: the checkpoint's for convolution "
                 "states, float32 for recurrent/SSM states; what policies without the field mean)",
         .use = kHashed,
         .syntax = Syntax::kStateDType,
         .unset = "native"});
  visit(o.seed, {.name = "seed",
                 .help = "Seed for the calibration data",
                 .use = kManifestRequired | kHashed | kRecorded});
  visit(o.device, {.name = "device", .help = "cpu, cuda or cuda:N", .use = kHashed});
  visit(o.dtype, {.name = "dtype",
                  .help = "Compute dtype (default: float32 on CPU, the checkpoint's on CUDA)",
                  .use = kHashed | kHideDefault});
  visit(o.micro_batch, {.name = "micro_batch",
                        .help = "Sequences per layer call (default: all)",
                        .use = kHashed | kHideDefault});
  visit(o.probe_samples, {.name = "probe_samples",
                          .help = "Sequences for the full-KV probe pass, which steers the walk's "
                                  "budget controller (default: half, rounded up)",
                          .use = kHashed | kRecorded | kHideDefault,
                          .record_value = c::effective_probe_samples});
  visit(o.attention_chunk,
        {.name = "attention_chunk", .help = "Queries per attention chunk", .use = kHashed});
  // Not hashed: it only moves the same tensors between device and host memory.
  visit(o.activations,
        {.name = "activations", .help = "Where calibration activations live: auto, device, host"});
  // Not hashed: it decides whether the run may start, and whether the measured layer stays
  // resident (a reload of the same weights), not what it computes.
  visit(o.memory_limit,
        {.name = "memory_limit",
         .help = "The most memory the run may plan for (g = GiB: 12g; host memory on cpu, the "
                 "device's on cuda); it refuses at once when its plan exceeds it. available: what "
                 "is free (under a memory cgroup, its limit)",
         .syntax = Syntax::kBytes,
         .unset = "available"});
  visit(o.conditioned, {.name = "conditioning",
                        .help = "Decide from curves measured with full KV below (the ablation "
                                "baseline)",
                        .use = kHashed | kRecorded,
                        .flag = "--no-conditioning",
                        .switch_sets = "false",
                        .hash_key = "conditioned",
                        .record_key = "method",
                        .record_value = c::method});
  // Hashed and recorded only above 1, so that every other policy keeps its hash.
  visit(o.tensor_parallel_size,
        {.name = "tensor_parallel_size",
         .help = "vLLM's tensor_parallel_size: every rank's shard of each global layer's KV heads "
                 "must hold the same windows (vLLM builds one cache layout for all ranks), so the "
                 "walk's windows are re-solved exactly under that constraint over its conditioned "
                 "curves; the report states the distortion it costs (docs/deploy.md)",
         .use = kHashed | kRecorded,
         .when = [](const CalibrationOptions& r) { return r.tensor_parallel_size != 1; }});
}

// The options as written on a command line or in a manifest entry: field name -> text, for the
// fields given (the others keep CalibrationOptions' defaults).
using CalibrationRequest = std::map<std::string, std::string, std::less<>>;

// Parses every given field with its type's parser; a FieldError (InputError) naming the field's
// flag when a value does not parse, or an InputError for a name no field has.
CalibrationOptions parse_calibration_options(const CalibrationRequest& request);

// The fields the inputs hash covers, by hash key, of options the job resolved (seq_len, samples,
// kv_dtype and keep_rules as the run uses them).
nlohmann::json hashed_options(const CalibrationOptions& resolved);
// Adds the kRecorded fields to a policy's provenance (policy.calibration).
void record_options(const CalibrationOptions& resolved, nlohmann::json& calibration);
// The flags (--budget) of the fields whose hashed values differ between two hashed_options().
std::vector<std::string> changed_options(const nlohmann::json& before, const nlohmann::json& now);

// The text a CalibrationOptions member of each type is parsed from, and its JSON (the hash's and,
// unless a field says otherwise, the provenance's). Defined for every member type.
void parse_field(std::string_view text, const Field& field, std::string& out);
void parse_field(std::string_view text, const Field& field, int64_t& out);
void parse_field(std::string_view text, const Field& field, uint64_t& out);
void parse_field(std::string_view text, const Field& field, bool& out);
void parse_field(std::string_view text, const Field& field, std::optional<int64_t>& out);
void parse_field(std::string_view text, const Field& field, std::optional<DType>& out);
void parse_field(std::string_view text, const Field& field, measure::WindowLadder& out);
void parse_field(std::string_view text, const Field& field, DistortionMeasure& out);
void parse_field(std::string_view text, const Field& field, ReSolve& out);
void parse_field(std::string_view text, const Field& field, Extrapolation& out);
void parse_field(std::string_view text, const Field& field, ActivationPlacement& out);

// A value as text, as --help shows a default (std::optional: the field's `unset` when not set).
std::string value_text(const std::string& value, const Field& field);
std::string value_text(const std::optional<int64_t>& value, const Field& field);
std::string value_text(const std::optional<DType>& value, const Field& field);
std::string value_text(const measure::WindowLadder& value, const Field& field);
std::string value_text(DistortionMeasure value, const Field& field);
std::string value_text(ReSolve value, const Field& field);
std::string value_text(Extrapolation value, const Field& field);
std::string value_text(ActivationPlacement value, const Field& field);
template <class T>
std::string field_text(const T& value, const Field& field) {
  if constexpr (std::is_same_v<T, bool>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_integral_v<T>) {
    return std::to_string(value);
  } else {
    return value_text(value, field);
  }
}

// "auto", "device", "host"; a FieldError naming `activations` otherwise.
ActivationPlacement parse_activation_placement(const std::string& text);

}  // namespace headwise::calib
