#include "headwise/solve/curves.hpp"

#include <set>
#include <utility>

#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"

namespace headwise::solve {
namespace {

using nlohmann::json;

const json& member(const json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end()) throw_input_error("{}: missing key \"{}\"", where, key);
  return *it;
}

int64_t integer_at(const json& object, const char* key, const std::string& where,
                   bool non_negative) {
  const json& value = member(object, key, where);
  // JSON numbers like 4096.0 are not accepted: bytes and ids are exact integers.
  if (!value.is_number_integer() ||
      (non_negative && value.is_number_integer() && value.get<int64_t>() < 0)) {
    throw_input_error("{}.{}: expected a{} integer, got {}", where, key,
                      non_negative ? " non-negative" : "n", value.dump());
  }
  return value.get<int64_t>();
}

int64_t window_at(const json& option, const std::string& where) {
  const json& value = member(option, "window", where);
  if (value.is_string() && value.get<std::string>() == "full") return kFullWindow;
  if (value.is_number_integer() && value.get<int64_t>() > 0) return value.get<int64_t>();
  throw_input_error("{}.window: expected a positive integer (tokens) or \"full\", got {}", where,
                    value.dump());
}

double distortion_at(const json& option, const std::string& where) {
  const json& value = member(option, "distortion", where);
  if (!value.is_number())
    throw_input_error("{}.distortion: expected a number, got {}", where, value.dump());
  return value.get<double>();
}

}  // namespace

std::vector<Group> groups_from_json(const json& document, const std::string& source) {
  if (!document.is_object())
    throw_input_error("{}: expected a JSON object with a \"heads\" array", source);
  const json& heads = member(document, "heads", source);
  if (!heads.is_array() || heads.empty())
    throw_input_error("{}: \"heads\" must be a non-empty array", source);
  std::vector<Group> groups;
  std::set<std::pair<int64_t, int64_t>> seen;
  for (size_t i = 0; i < heads.size(); ++i) {
    const std::string where = fmt::format("{}: heads[{}]", source, i);
    const json& head = heads[i];
    if (!head.is_object()) throw_input_error("{}: expected an object", where);
    Group group;
    group.layer_id = integer_at(head, "layer_id", where, true);
    group.kv_head = integer_at(head, "kv_head", where, true);
    const json& options = member(head, "options", where);
    if (!options.is_array()) throw_input_error("{}.options: expected an array", where);
    for (size_t k = 0; k < options.size(); ++k) {
      const std::string at = fmt::format("{}.options[{}]", where, k);
      if (!options[k].is_object()) throw_input_error("{}: expected an object", at);
      group.options.push_back({window_at(options[k], at), integer_at(options[k], "bytes", at, true),
                               distortion_at(options[k], at)});
    }
    if (!seen.insert({group.layer_id, group.kv_head}).second) {
      throw_input_error("{}: layer {} KV head {} listed twice", where, group.layer_id,
                        group.kv_head);
    }
    groups.push_back(std::move(group));
  }
  try {
    validate_groups(groups);
  } catch (const InputError& e) {
    throw InputError(fmt::format("{}: {}", source, e.what()));
  }
  return groups;
}

std::vector<Group> read_curves_file(const std::filesystem::path& path) {
  return groups_from_json(read_json_file(path), path.string());
}

json groups_to_json(const std::vector<Group>& groups) {
  json heads = json::array();
  for (const auto& group : groups) {
    json options = json::array();
    for (const auto& option : group.options) {
      options.push_back(
          {{"window", option.window == kFullWindow ? json("full") : json(option.window)},
           {"bytes", option.bytes},
           {"distortion", option.distortion}});
    }
    heads.push_back({{"layer_id", group.layer_id},
                     {"kv_head", group.kv_head},
                     {"options", std::move(options)}});
  }
  return {{"heads", std::move(heads)}};
}

json solution_to_json(const std::vector<Group>& groups, const SolveResult& result) {
  json choices = json::array();
  for (size_t g = 0; g < groups.size(); ++g) {
    const int64_t window = groups[g].options[result.choice[g]].window;
    choices.push_back({{"layer_id", groups[g].layer_id},
                       {"kv_head", groups[g].kv_head},
                       {"window", window == kFullWindow ? json("full") : json(window)}});
  }
  return {{"total_bytes", result.total_bytes},
          {"total_distortion", result.total_distortion},
          {"proven_optimal", result.proven_optimal},
          {"choices", std::move(choices)}};
}

}  // namespace headwise::solve
