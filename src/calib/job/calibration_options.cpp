// The options' parsers, JSON and the walks over visit_fields() (calibration_options.hpp).
#include "headwise/calib/calibration_options.hpp"

#include <charconv>

#include "calib/job/auto_samples.hpp"
#include "headwise/calib/measure_traits.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::calib {
namespace {
using nlohmann::json;

std::string flag_of(const Field& f) {
  return f.flag.empty() ? option_spelling(f.name) : std::string(f.flag);
}

std::string_view hash_key(const Field& f) {
  return f.hash_key.empty() ? f.name : f.hash_key;
}

template <class Integer>
Integer parse_integer(std::string_view text, const Field& f) {
  Integer value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    throw_field_error(f.name, ": '{}' is not {}", text,
                      std::is_signed_v<Integer> ? "an integer" : "a non-negative integer");
  }
  return value;
}

// A member's JSON: its value's, by name for the enums, nothing (null) for an unset optional.
json to_json(const std::string& v) {
  return v;
}
json to_json(int64_t v) {
  return v;
}
json to_json(uint64_t v) {
  return v;
}
json to_json(bool v) {
  return v;
}
json to_json(const std::optional<int64_t>& v) {
  return v ? json(*v) : json();
}
json to_json(const std::optional<DType>& v) {
  return v ? json(std::string(dtype_name(*v))) : json();
}
json to_json(const measure::WindowLadder& v) {
  return v.levels;
}
json to_json(DistortionMeasure v) {
  return distortion_measure_name(v);
}
json to_json(ReSolve v) {
  return v == ReSolve::kRewalk ? "rewalk" : "span";
}
json to_json(Extrapolation v) {
  return extrapolation_name(v);
}
json to_json(ActivationPlacement v) {
  switch (v) {
    case ActivationPlacement::kDevice:
      return "device";
    case ActivationPlacement::kHost:
      return "host";
    case ActivationPlacement::kAuto:
      break;
  }
  return "auto";
}

// `at` may be "a/b": nested objects.
void put(json& into, std::string_view at, json value) {
  json* node = &into;
  for (size_t slash; (slash = at.find('/')) != std::string_view::npos; at.remove_prefix(slash + 1))
    node = &(*node)[std::string(at.substr(0, slash))];
  (*node)[std::string(at)] = std::move(value);
}

// --samples-cap bounds the auto rule, which starts at the default's 8 sequences: a cap given
// without the rule, or one the first round already exceeds, would be silently ignored.
void check_auto_samples(const CalibrationOptions& o, const CalibrationRequest& request) {
  if (!request.contains("samples_cap")) return;
  if (o.samples) {
    throw_field_error("samples_cap", " bounds {} auto only (got {} {})", field_ref("samples"),
                      field_ref("samples"), *o.samples);
  }
  if (o.samples_cap < kAutoFirstSamples) {
    throw_field_error("samples_cap", " must be at least {} (the rule's first round), got {}",
                      kAutoFirstSamples, o.samples_cap);
  }
}

}  // namespace

measure::WindowLadder CalibrationOptions::default_windows() {
  return measure::parse_window_ladder("1k,4k,16k,64k,full", "--windows");
}

namespace field_conditions {
bool on_span(const CalibrationOptions& o) {
  return measure_traits(o.distortion).runs_on_span;
}
bool scores_answers(const CalibrationOptions& o) {
  return measure_traits(o.distortion).scores_answers;
}
bool selecting_keep_rules(const CalibrationOptions& o) {
  return o.keep_rules != "window" && o.keep_rules != "auto";
}
bool extrapolates(const CalibrationOptions& o) {
  for (int64_t w : o.windows.levels) {
    if (w != kFullWindow && w >= o.seq_len.value_or(0) && w < o.context) return true;
  }
  return false;
}
bool auto_samples(const CalibrationOptions& o) {
  return !o.samples.has_value();
}
json effective_probe_samples(const CalibrationOptions& o) {
  return o.samples ? json(calib::effective_probe_samples(o.probe_samples, *o.samples)) : json();
}
json measure_provenance(const CalibrationOptions& o) {
  return measure_traits(o.distortion).provenance_name;
}
json method(const CalibrationOptions& o) {
  return o.conditioned ? "seqcalib" : "unconditioned";
}
json heads(const CalibrationOptions& o) {
  return o.joint_heads ? "joint" : "independent";
}
}  // namespace field_conditions

void parse_field(std::string_view text, const Field&, std::string& out) {
  out = std::string(text);
}
void parse_field(std::string_view text, const Field& f, int64_t& out) {
  switch (f.syntax) {
    case Syntax::kTokens:
      out = parse_token_count(text, option_spelling(f.name));
      return;
    case Syntax::kBytes:
      out = parse_byte_size(text, option_spelling(f.name));
      return;
    default:
      out = parse_integer<int64_t>(text, f);
  }
}
void parse_field(std::string_view text, const Field& f, uint64_t& out) {
  out = parse_integer<uint64_t>(text, f);
}
void parse_field(std::string_view text, const Field& f, bool& out) {
  if (text != "true" && text != "false")
    throw_field_error(f.name, ": '{}' is not true or false", text);
  out = text == "true";
}
void parse_field(std::string_view text, const Field& f, std::optional<int64_t>& out) {
  if (text == f.unset) {
    out.reset();
    return;
  }
  int64_t value = 0;
  parse_field(text, f, value);
  out = value;
}
void parse_field(std::string_view text, const Field& f, std::optional<DType>& out) {
  if (text == f.unset) {
    out.reset();
  } else if (f.syntax == Syntax::kStateDType) {
    out = policy::parse_state_dtype(text, option_spelling(f.name));
  } else {
    out = parse_dtype(text, option_spelling(f.name));
  }
}
void parse_field(std::string_view text, const Field& f, measure::WindowLadder& out) {
  out = measure::parse_window_ladder(text, option_spelling(f.name));
}
void parse_field(std::string_view text, const Field&, DistortionMeasure& out) {
  out = parse_distortion_measure(std::string(text));
}
void parse_field(std::string_view text, const Field& f, ReSolve& out) {
  if (text == "span") {
    out = ReSolve::kSpan;
  } else if (text == "rewalk") {
    out = ReSolve::kRewalk;
  } else {
    throw_field_error(f.name, ": '{}' is not one of span, rewalk", text);
  }
}
void parse_field(std::string_view text, const Field&, Extrapolation& out) {
  out = parse_extrapolation(std::string(text));
}
void parse_field(std::string_view text, const Field&, ActivationPlacement& out) {
  out = parse_activation_placement(std::string(text));
}

std::string value_text(const std::string& value, const Field&) {
  return value;
}
std::string value_text(const std::optional<int64_t>& value, const Field& f) {
  return value ? std::to_string(*value) : std::string(f.unset);
}
std::string value_text(const std::optional<DType>& value, const Field& f) {
  return value ? std::string(dtype_name(*value)) : std::string(f.unset);
}
std::string value_text(const measure::WindowLadder& value, const Field&) {
  return value.to_string();
}
std::string value_text(DistortionMeasure value, const Field&) {
  return to_json(value).get<std::string>();
}
std::string value_text(ReSolve value, const Field&) {
  return to_json(value).get<std::string>();
}
std::string value_text(Extrapolation value, const Field&) {
  return to_json(value).get<std::string>();
}
std::string value_text(ActivationPlacement value, const Field&) {
  return to_json(value).get<std::string>();
}

ActivationPlacement parse_activation_placement(const std::string& text) {
  if (text == "auto") return ActivationPlacement::kAuto;
  if (text == "device") return ActivationPlacement::kDevice;
  if (text == "host") return ActivationPlacement::kHost;
  throw_field_error("activations", ": '{}' is not one of auto, device, host", text);
}

CalibrationOptions parse_calibration_options(const CalibrationRequest& request) {
  CalibrationOptions o;
  size_t used = 0;
  visit_fields(o, [&](auto& member, const Field& f) {
    const auto it = request.find(f.name);
    if (it == request.end()) return;
    parse_field(it->second, f, member);
    ++used;
  });
  if (used != request.size()) {
    for (const auto& [name, _] : request) {
      bool known = false;
      visit_fields(o, [&](auto&, const Field& f) { known = known || f.name == name; });
      if (!known) throw_input_error("no calibration option is called '{}'", name);
    }
  }
  // headwise's bytes have no batched-token reservation: a value given without vllm's engine
  // would be silently ignored (mem-estimate refuses it the same way).
  if (request.contains("max_num_batched_tokens") && o.engine != "vllm") {
    throw_field_error("max_num_batched_tokens",
                      " is vLLM's reservation setting: it counts only with {} vllm (got {} {})",
                      field_ref("engine"), field_ref("engine"), o.engine);
  }
  check_auto_samples(o, request);
  return o;
}

json hashed_options(const CalibrationOptions& resolved) {
  json out = json::object();
  visit_fields(resolved, [&](const auto& member, const Field& f) {
    if (!(f.use & kHashed) || (f.when && !f.when(resolved))) return;
    json value = to_json(member);
    if (!value.is_null()) out[std::string(hash_key(f))] = std::move(value);
  });
  return out;
}

void record_options(const CalibrationOptions& resolved, json& calibration) {
  visit_fields(resolved, [&](const auto& member, const Field& f) {
    if (!(f.use & kRecorded)) return;
    const Field::Condition when = f.record_when ? f.record_when : f.when;
    if (when && !when(resolved)) return;
    json value = f.record_value ? f.record_value(resolved) : to_json(member);
    if (!value.is_null()) put(calibration, f.record_key.empty() ? f.name : f.record_key, value);
  });
}

std::vector<std::string> changed_options(const json& before, const json& now) {
  std::vector<std::string> flags;
  const CalibrationOptions defaults;
  visit_fields(defaults, [&](const auto&, const Field& f) {
    if (!(f.use & kHashed)) return;
    const std::string key(hash_key(f));
    const json a = before.contains(key) ? before[key] : json(),
               b = now.contains(key) ? now[key] : json();
    if (a != b) flags.push_back(flag_of(f));
  });
  return flags;
}

}  // namespace headwise::calib
