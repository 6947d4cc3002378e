// The calibration options' field list (calibration_options.hpp): every use of an option (flags,
// manifest keys, parsing, the inputs hash, the provenance, the resume check) walks it.
#include <catch2/catch.hpp>

#include <set>

#include "headwise/calib/calibration_job.hpp"
#include "headwise/calib/calibration_options.hpp"
#include "headwise/calib/keep_rules.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/core/error.hpp"

using namespace headwise;
using calib::CalibrationOptions;
using nlohmann::json;

namespace {

// Options as the job resolves them (seq_len, samples, kv_dtype and keep rules as the run uses).
CalibrationOptions resolved(const calib::CalibrationRequest& request) {
  CalibrationOptions o = calib::parse_calibration_options(request);
  o.keep_rules = calib::resolve_keep_rules(o.keep_rules, o.distortion);
  if (!o.seq_len) o.seq_len = 2048;
  if (!o.kv_dtype) o.kv_dtype = DType::kBFloat16;
  return o;
}

// What the inputs hash covered before the field list, written out the way calibration_job.cpp
// wrote it (main c2a1558): the list must reproduce it key for key and value for value, or every
// committed policy's inputs_sha256 changes.
json legacy_hashed(const CalibrationOptions& o) {
  const auto& traits = calib::measure_traits(o.distortion);
  json inputs = {
      {"context", o.context},
      {"budget_bytes", o.budget},
      {"windows", o.windows.levels},
      {"samples", *o.samples},
      {"seq_len", *o.seq_len},
      {"block_size", o.block_size},
      {"batch", o.batch},
      {"sink_tokens", o.sink_tokens},
      {"kv_dtype", std::string(dtype_name(*o.kv_dtype))},
      {"seed", o.seed},
      {"device", o.device},
      {"dtype", o.dtype},
      {"micro_batch", o.micro_batch},
      {"probe_samples", o.probe_samples},
      {"attention_chunk", o.attention_chunk},
      {"conditioned", o.conditioned},
      {"distortion", calib::distortion_measure_name(o.distortion)},
      {"joint_heads", o.joint_heads},
      {"extrapolate", calib::extrapolation_name(o.extrapolate)},
  };
  if (traits.runs_on_span) {
    inputs["span_margin"] = o.span_margin;
    inputs["re_solve"] = o.re_solve == calib::ReSolve::kRewalk ? "rewalk" : "span";
  }
  if (o.state_dtype) inputs["state_dtype"] = std::string(dtype_name(*o.state_dtype));
  if (o.keep_rules == "window,h2o") {
    inputs["keep_rules"] = "window,h2o";
    inputs["prefill_chunk"] = o.prefill_chunk;
  }
  return inputs;
}

}  // namespace

TEST_CASE("the inputs hash covers the options it covered before the field list", "[calib]") {
  const calib::CalibrationRequest base = {{"model", "m"}, {"context", "4k"}, {"budget", "1m"}};
  const std::vector<calib::CalibrationRequest> extras = {
      {},
      {{"distortion", "block-mse"}, {"state_dtype", "native"}, {"seq_len", "512"}},
      {{"distortion", "answer-kl"}, {"keep_rules", "window"}, {"joint_heads", "false"}},
      {{"distortion", "answer-kl-span"},
       {"re_solve", "rewalk"},
       {"span_margin", "3"},
       {"keep_rules", "h2o,window"},
       {"prefill_chunk", "64"},
       {"conditioning", "false"},
       {"kv_dtype", "float16"},
       {"seed", "18446744073709551615"},
       {"dtype", "bfloat16"},
       {"device", "cuda:1"},
       {"micro_batch", "2"},
       {"probe_samples", "3"},
       {"attention_chunk", "64"},
       {"block_size", "1"},
       {"batch", "2"},
       {"sink_tokens", "4"},
       {"extrapolate", "power-law"},
       {"windows", "8,32,full"},
       {"samples", "5"},
       {"activations", "host"},       // not hashed: it moves tensors only
       {"validate_measure", "true"},  // not hashed: the report's only
       {"calib", "data.jsonl"}},      // hashed as the data's description and sha256
  };
  for (const auto& extra : extras) {
    calib::CalibrationRequest request = base;
    request.insert(extra.begin(), extra.end());
    const CalibrationOptions o = resolved(request);
    INFO(json(request).dump());
    CHECK(calib::hashed_options(o).dump() == legacy_hashed(o).dump());
  }
}

TEST_CASE("samples auto hashes its cap instead of the sequences; fixed runs keep their hash",
          "[calib]") {
  const calib::CalibrationRequest base = {{"model", "m"}, {"context", "4k"}, {"budget", "1m"}};
  calib::CalibrationRequest request = base;
  request["samples"] = "auto";
  json hashed = calib::hashed_options(resolved(request));
  CHECK_FALSE(hashed.contains("samples"));
  CHECK(hashed["samples_cap"] == 32);
  request["samples_cap"] = "48";
  hashed = calib::hashed_options(resolved(request));
  CHECK(hashed["samples_cap"] == 48);
  // Without auto the cap is neither hashed nor recorded, and the default stays 8.
  const CalibrationOptions fixed = resolved(base);
  CHECK(fixed.samples == 8);
  CHECK_FALSE(calib::hashed_options(fixed).contains("samples_cap"));
  json recorded = json::object();
  calib::record_options(fixed, recorded);
  CHECK_FALSE(recorded.contains("samples_cap"));
  CHECK_FALSE(recorded.contains("samples_auto"));
}

// The revisions in inputs_sha256: every run keeps revision 2 alone (so every policy written since
// keeps its hash), and only a tensor-parallel run (a --decisions stable run) adds its walk's
// (its rule's) own, so that a plain regen recalibrates such a policy written before it changed.
TEST_CASE("the inputs hash has the TP walk's and the stable rule's revisions only for their runs",
          "[calib]") {
  const calib::CalibrationRequest base = {{"model", "m"}, {"context", "4k"}, {"budget", "1m"}};
  CHECK(calib::calibration_revisions(resolved(base)) == json{{"calibration_revision", 2}});
  calib::CalibrationRequest tp = base;
  tp["tensor_parallel_size"] = "2";
  tp["engine"] = "vllm";
  CHECK(calib::calibration_revisions(resolved(tp)) ==
        json{{"calibration_revision", 2}, {"tensor_parallel_revision", 1}});
  calib::CalibrationRequest stable = base;
  stable["decisions"] = "stable";
  CHECK(calib::calibration_revisions(resolved(stable)) ==
        json{{"calibration_revision", 2}, {"stable_decisions_revision", 1}});
}

TEST_CASE("policy.calibration records the options it recorded before the field list", "[calib]") {
  calib::CalibrationRequest request = {{"model", "m"},         {"context", "4k"},
                                       {"budget", "1m"},       {"windows", "64,2k,full"},
                                       {"seq_len", "1k"},      {"extrapolate", "as-full"},
                                       {"keep_rules", "auto"}, {"probe_samples", "0"},
                                       {"samples", "7"},       {"seed", "2"}};
  json recorded = json::object();
  calib::record_options(resolved(request), recorded);
  CHECK((recorded == json{{"answer_span", {{"margin", 8}, {"re_solve", "span"}}},
                          {"distortion_measure", "answer-tv-span"},
                          {"extrapolation", "as-full"},
                          {"heads", "joint"},
                          {"keep_rules", "window,h2o"},
                          {"method", "seqcalib"},
                          {"prefill_chunk", 256},
                          {"probe_samples", 4},
                          {"samples", 7},
                          {"seed", 2},
                          {"seq_len", 1024}}));
  // block-mse, no conditioning, every level measured: no answer, span or extrapolation keys.
  request["distortion"] = "block-mse";
  request["conditioning"] = "false";
  request["windows"] = "64,full";
  recorded = json::object();
  calib::record_options(resolved(request), recorded);
  CHECK((recorded == json{{"distortion_measure", "block_output_relative_mse"},
                          {"method", "unconditioned"},
                          {"probe_samples", 4},
                          {"samples", 7},
                          {"seed", 2},
                          {"seq_len", 1024}}));
}

TEST_CASE("every field has its own name, flag and hash key, and its default reads back",
          "[calib]") {
  std::set<std::string> names, flags, hash_keys;
  const CalibrationOptions defaults;
  calib::visit_fields(defaults, [&](const auto& value, const calib::Field& f) {
    INFO(f.name);
    CHECK(names.insert(std::string(f.name)).second);
    CHECK(flags.insert(f.flag.empty() ? option_spelling(f.name) : std::string(f.flag)).second);
    if (f.use & calib::kHashed)
      CHECK(hash_keys.insert(std::string(f.hash_key.empty() ? f.name : f.hash_key)).second);
    CHECK_FALSE(f.help.empty());
    if (f.use & calib::kRequired) return;  // no default to show
    // --help shows field_text(default); it parses, to the same text.
    const std::string text = calib::field_text(value, f);
    auto parsed = value;
    calib::parse_field(text, f, parsed);
    CHECK(calib::field_text(parsed, f) == text);
  });
  CHECK(names.size() > 25);
}

TEST_CASE("parsing a request names the flag at fault in one line", "[calib]") {
  const auto error = [](const calib::CalibrationRequest& request) -> std::string {
    try {
      (void)calib::parse_calibration_options(request);
    } catch (const InputError& e) {
      return e.what();
    }
    return "(accepted)";
  };
  CHECK_THAT(error({{"seq_len", "10x"}}), Catch::Contains("--seq-len"));
  CHECK_THAT(error({{"samples", "many"}}), Catch::Contains("--samples: 'many' is not an integer"));
  CHECK_THAT(error({{"seed", "-1"}}), Catch::Contains("--seed"));
  CHECK_THAT(error({{"re_solve", "twice"}}), Catch::Contains("'twice' is not one of span, rewalk"));
  CHECK_THAT(error({{"state_dtype", "int8"}}), Catch::Contains("--state-dtype"));
  CHECK_THAT(error({{"activations", "gpu"}}), Catch::Contains("--activations"));
  CHECK_THAT(error({{"budgett", "1"}}), Catch::Contains("'budgett'"));
  // vLLM's reservation setting without vLLM's engine would be ignored: refused, naming both.
  CHECK_THAT(error({{"max_num_batched_tokens", "2048"}}),
             Catch::Contains("--max-num-batched-tokens") && Catch::Contains("--engine vllm"));
  CHECK(error({{"max_num_batched_tokens", "2048"}, {"engine", "vllm"}}) == "(accepted)");
  CHECK(error({{"seq_len", "auto"}, {"state_dtype", "native"}, {"kv_dtype", "fp8"}}) ==
        "(accepted)");
}

TEST_CASE("the resume check names the options that changed", "[calib]") {
  const calib::CalibrationRequest base = {{"model", "m"}, {"context", "4k"}, {"budget", "1m"}};
  calib::CalibrationRequest other = base;
  other["seed"] = "4";
  other["conditioning"] = "false";
  other["activations"] = "host";  // not hashed: a checkpoint resumes across it
  const auto changed = calib::changed_options(calib::hashed_options(resolved(base)),
                                              calib::hashed_options(resolved(other)));
  CHECK((changed == std::vector<std::string>{"--seed", "--no-conditioning"}));
}
