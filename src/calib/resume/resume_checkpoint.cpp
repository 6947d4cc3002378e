#include "headwise/calib/resume_checkpoint.hpp"

#include <bit>
#include <cinttypes>
#include <cstdio>

#include "headwise/core/error.hpp"

namespace headwise::calib {
namespace {
using nlohmann::json;

// Exact bits, not decimal: the resumed run must decide from the very same numbers.
std::string bits(double value) {
  return fmt::format("{:016x}", std::bit_cast<uint64_t>(value));
}

double from_bits(const json& j, std::string_view where) {
  if (!j.is_string() || j.get<std::string>().size() != 16)
    throw_input_error("{}: malformed number in checkpoint", where);
  uint64_t raw = 0;
  if (std::sscanf(j.get<std::string>().c_str(), "%16" SCNx64, &raw) != 1) {
    throw_input_error("{}: malformed number in checkpoint", where);
  }
  return std::bit_cast<double>(raw);
}

json group_json(const solve::Group& g) {
  json options = json::array();
  for (const auto& o : g.options) options.push_back({o.window, o.bytes, bits(o.distortion)});
  return {{"layer", g.layer_id}, {"head", g.kv_head}, {"options", options}};
}

solve::Group group_from(const json& j, std::string_view where) {
  solve::Group g{j.at("layer").get<int64_t>(), j.at("head").get<int64_t>(), {}};
  for (const auto& o : j.at("options")) {
    g.options.push_back(
        {o.at(0).get<int64_t>(), o.at(1).get<int64_t>(), from_bits(o.at(2), where)});
  }
  return g;
}

}  // namespace

json resume_checkpoint_to_json(const ResumeCheckpoint& state) {
  json probe = json::array();
  for (const auto& [layer, groups] : state.probe_groups) {
    for (const auto& g : groups) probe.push_back(group_json(g));
  }
  json decided = json::array();
  for (const auto& g : state.decided_groups) decided.push_back(group_json(g));
  json windows = json::array();
  for (const auto& [layer, w] : state.windows)
    windows.push_back({{"layer", layer}, {"windows", w}});
  json layers = json::array();
  for (const auto& r : state.layers) {
    layers.push_back({{"layer", r.layer_id},
                      {"kind", r.kind},
                      {"seconds", bits(r.seconds)},
                      {"lambda", bits(r.lambda)},
                      {"bytes_spent", r.bytes_spent},
                      {"planned_ahead", r.planned_ahead}});
  }
  return {{"last_layer", state.last_layer},
          {"probe_lambda", bits(state.probe_lambda)},
          {"probe_seconds", bits(state.probe_seconds)},
          {"probe_groups", probe},
          {"windows", windows},
          {"decided_groups", decided},
          {"decided_choice", state.decided_choice},
          {"spent", state.spent},
          {"layers", layers}};
}

ResumeCheckpoint resume_checkpoint_from_json(const json& j, std::string_view where) {
  // The checkpoint is ours and hash-checked before this runs: a missing or mistyped key means
  // a damaged file, reported as such rather than as a library exception.
  try {
    ResumeCheckpoint s;
    s.last_layer = j.at("last_layer").get<int64_t>();
    s.probe_lambda = from_bits(j.at("probe_lambda"), where);
    s.probe_seconds = from_bits(j.at("probe_seconds"), where);
    for (const auto& g : j.at("probe_groups")) {
      solve::Group group = group_from(g, where);
      s.probe_groups[group.layer_id].push_back(std::move(group));
    }
    for (const auto& w : j.at("windows"))
      s.windows[w.at("layer").get<int64_t>()] = w.at("windows").get<std::vector<int64_t>>();
    for (const auto& g : j.at("decided_groups")) s.decided_groups.push_back(group_from(g, where));
    s.decided_choice = j.at("decided_choice").get<std::vector<size_t>>();
    s.spent = j.at("spent").get<int64_t>();
    for (const auto& r : j.at("layers")) {
      s.layers.push_back({r.at("layer").get<int64_t>(), r.at("kind").get<std::string>(),
                          from_bits(r.at("seconds"), where), from_bits(r.at("lambda"), where),
                          r.at("bytes_spent").get<int64_t>(),
                          r.at("planned_ahead").get<int64_t>()});
    }
    if (s.decided_choice.size() != s.decided_groups.size())
      throw_input_error("{}: checkpoint is inconsistent", where);
    return s;
  } catch (const json::exception& e) {
    throw_input_error("{}: damaged checkpoint ({}); delete it and rerun without --resume", where,
                      e.what());
  }
}

}  // namespace headwise::calib
