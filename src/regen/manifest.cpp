// Strict reader of policies/manifest.yaml (format in manifest.hpp).
#include "headwise/regen/manifest.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <regex>
#include <set>
#include <type_traits>

#include "headwise/calib/answer_reference.hpp"
#include "headwise/calib/calibration_options.hpp"
#include "headwise/calib/keep_rules.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"

namespace headwise::regen {
namespace {
namespace fs = std::filesystem;

class EntryReader {
 public:
  EntryReader(std::string_view where, std::string context)
      : where_(where), context_(std::move(context)) {}

  [[noreturn]] void fail(const YAML::Node& node, std::string_view key,
                         std::string_view message) const {
    const YAML::Mark mark = node.Mark();
    const std::string at = key.empty() ? context_ : fmt::format("{}: {}", context_, key);
    if (mark.is_null()) throw_input_error("{}: {}: {}", where_, at, message);
    throw_input_error("{}:{}:{}: {}: {}", where_, mark.line + 1, mark.column + 1, at, message);
  }

  std::string text(const YAML::Node& map, const char* key) const {
    const YAML::Node node = map[key];
    if (!node.IsScalar() || node.Scalar().empty())
      fail(node ? node : map, key, "must be a non-empty single value");
    return node.Scalar();
  }

  int64_t integer(const YAML::Node& map, const char* key) const {
    const std::string s = text(map, key);
    int64_t value = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size())
      fail(map[key], key, fmt::format("'{}' is not an integer", s));
    return value;
  }

  bool boolean(const YAML::Node& map, const char* key) const {
    const std::string s = text(map, key);
    if (s == "true") return true;
    if (s == "false") return false;
    fail(map[key], key, fmt::format("'{}' is not true or false", s));
  }

  // "64,256,full" or [64, 256, full]: the main command's --windows syntax either way.
  std::string ladder(const YAML::Node& map, const char* key) const {
    const YAML::Node node = map[key];
    if (node.IsScalar()) return text(map, key);
    if (!node.IsSequence() || node.size() == 0)
      fail(node, key, "must be a list of window levels or 'a,b,full'");
    std::string joined;
    for (const auto& level : node) {
      if (!level.IsScalar()) fail(level, key, "every level must be a single value");
      joined += (joined.empty() ? "" : ",") + level.Scalar();
    }
    return joined;
  }

 private:
  std::string where_;
  std::string context_;
};

// Besides the calibration options (calibration_options.hpp: every field, by its name).
const std::set<std::string> kEntryKeys = {"name", "output"};

std::string resolve(const fs::path& base, const std::string& path) {
  const fs::path p(path);
  return (p.is_absolute() || base.empty() ? p : (base / p)).lexically_normal().string();
}

// The allowed keys and the required ones: the entry's own and every calibration field's.
std::pair<std::set<std::string>, std::set<std::string>> entry_keys() {
  std::set<std::string> all = kEntryKeys, required = kEntryKeys;
  const calib::CalibrationOptions defaults;
  calib::visit_fields(defaults, [&](const auto&, const calib::Field& f) {
    all.emplace(f.name);
    if (f.use & (calib::kRequired | calib::kManifestRequired)) required.emplace(f.name);
  });
  return {all, required};
}

// A calibration field's value as text, type-checked where the manifest's own syntax decides
// (integers, booleans, ladders as lists), so the error points at the line.
template <class T>
std::string field_value(const EntryReader& r, const YAML::Node& node, const calib::Field& f,
                        const fs::path& base) {
  const std::string key(f.name);
  if constexpr (std::is_same_v<T, bool>) {
    return r.boolean(node, key.c_str()) ? "true" : "false";
  } else if constexpr (std::is_same_v<T, measure::WindowLadder>) {
    return r.ladder(node, key.c_str());
  } else {
    if (std::is_integral_v<T> && f.syntax == calib::Syntax::kPlain) {  // not 4k, 1g
      const int64_t value = r.integer(node, key.c_str());
      if (std::is_unsigned_v<T> && value < 0) r.fail(node[key], key, "must be >= 0");
      return std::to_string(value);
    }
    const std::string text = r.text(node, key.c_str());
    return f.use & calib::kPath ? resolve(base, text) : text;
  }
}

ManifestEntry parse_entry(const YAML::Node& node, size_t index, std::string_view where,
                          const fs::path& base) {
  const std::string fallback = fmt::format("policies[{}]", index);
  if (!node.IsMap())
    EntryReader(where, fallback).fail(node, "", "must be a mapping of name, model, context, ...");
  const std::string name = node["name"] && node["name"].IsScalar() ? node["name"].Scalar() : "";
  const EntryReader r(where, name.empty() ? fallback : fmt::format("entry '{}'", name));
  const auto [allowed, required] = entry_keys();
  for (const auto& item : node) {
    const std::string key = item.first.Scalar();
    if (!allowed.contains(key))
      r.fail(item.first, key, fmt::format("unknown key (allowed: {})", fmt::join(allowed, ", ")));
  }
  for (const auto& key : required) {
    if (!node[key]) r.fail(node, key, "is missing");
  }
  static const std::regex kName("[A-Za-z0-9._-]+");
  if (!std::regex_match(r.text(node, "name"), kName))
    r.fail(node["name"], "name", "may hold only A-Z a-z 0-9 . _ -");

  ManifestEntry e;
  e.name = r.text(node, "name");
  e.output = resolve(base, r.text(node, "output"));
  const calib::CalibrationOptions defaults;
  calib::visit_fields(defaults, [&](const auto& value, const calib::Field& f) {
    if (node[std::string(f.name)])
      e.request[std::string(f.name)] = field_value<std::decay_t<decltype(value)>>(r, node, f, base);
  });
  return e;
}

}  // namespace

Manifest parse_manifest(std::string_view text, std::string_view where, const fs::path& base) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    throw_input_error("{}:{}:{}: malformed YAML: {}", where, e.mark.line + 1, e.mark.column + 1,
                      e.msg);
  }
  const EntryReader top(where, "manifest");
  if (!root.IsMap()) top.fail(root, "", "must be a mapping with a 'policies' list");
  for (const auto& item : root) {
    const std::string key = item.first.Scalar();
    if (key != "policies" && key != "recalibrate_on_check") {
      top.fail(item.first, key, "unknown key (allowed: policies, recalibrate_on_check)");
    }
  }
  const YAML::Node list = root["policies"];
  if (!list || !list.IsSequence() || list.size() == 0)
    top.fail(root, "policies", "must be a non-empty list of entries");
  Manifest manifest;
  manifest.path = fs::path(std::string(where));
  std::set<std::string> names, outputs;
  for (size_t i = 0; i < list.size(); ++i) {
    ManifestEntry entry = parse_entry(list[i], i, where, base);
    if (!names.insert(entry.name).second)
      top.fail(list[i]["name"], "name", fmt::format("'{}' appears twice", entry.name));
    if (!outputs.insert(entry.output.string()).second) {
      top.fail(list[i]["output"], "output",
               fmt::format("entry '{}' writes {}, as an earlier entry does", entry.name,
                           entry.output.string()));
    }
    manifest.entries.push_back(std::move(entry));
  }
  if (const YAML::Node list = root["recalibrate_on_check"]) {
    if (!list.IsSequence()) top.fail(list, "recalibrate_on_check", "must be a list of entry names");
    std::vector<std::string> chosen;
    for (const auto& item : list) {
      if (!item.IsScalar())
        top.fail(item, "recalibrate_on_check", "every item must be an entry name");
      const std::string name = item.Scalar();
      if (!names.contains(name)) {
        top.fail(item, "recalibrate_on_check",
                 fmt::format("no entry '{}' (entries: {})", name, fmt::join(names, ", ")));
      }
      if (std::find(chosen.begin(), chosen.end(), name) != chosen.end()) {
        top.fail(item, "recalibrate_on_check", fmt::format("'{}' appears twice", name));
      }
      chosen.push_back(name);
    }
    manifest.recalibrate_on_check = std::move(chosen);
  }
  return manifest;
}

bool Manifest::recalibrated_on_check(const std::string& name) const {
  return !recalibrate_on_check ||
         std::find(recalibrate_on_check->begin(), recalibrate_on_check->end(), name) !=
             recalibrate_on_check->end();
}

CalibrationKind calibration_kind(const calib::CalibrationRequest& request) {
  const calib::CalibrationOptions o = calib::parse_calibration_options(request);
  return {calib::distortion_measure_name(o.distortion),
          calib::resolve_keep_rules(o.keep_rules, o.distortion),
          o.conditioned ? "seqcalib" : "unconditioned"};
}

void check_recalibration_coverage(const Manifest& manifest) {
  if (!manifest.recalibrate_on_check) return;
  struct Use {
    std::set<std::string> everywhere;  // the entries that use the value
    bool covered = false;
  };
  std::map<std::pair<std::string, std::string>, Use> uses;  // (what, value)
  for (const auto& e : manifest.entries) {
    CalibrationKind kind;
    try {
      kind = calibration_kind(e.request);
    } catch (const FieldError& error) {
      throw error.prefixed(fmt::format("{}: entry '{}': ", manifest.path.string(), e.name));
    } catch (const InputError& error) {
      throw_input_error("{}: entry '{}': {}", manifest.path.string(), e.name, error.what());
    }
    const bool recalibrated = manifest.recalibrated_on_check(e.name);
    for (const auto& [what, value] :
         {std::pair<std::string, std::string>{"distortion measure", kind.measure},
          {"keep rules", kind.keep_rules},
          {"method", kind.method}}) {
      Use& use = uses[{what, value}];
      use.everywhere.insert(e.name);
      use.covered = use.covered || recalibrated;
    }
  }
  std::vector<std::string> uncovered;
  for (const auto& [key, use] : uses) {
    if (!use.covered)
      uncovered.push_back(fmt::format("{} '{}' (used by {})", key.first, key.second,
                                      fmt::join(use.everywhere, ", ")));
  }
  if (!uncovered.empty()) {
    throw_input_error(
        "{}: recalibrate_on_check: no entry it names calibrates with {}: list under "
        "recalibrate_on_check "
        "one entry that uses each of these, so regen --check runs that code",
        manifest.path.string(), fmt::join(uncovered, "; "));
  }
}

Manifest read_manifest(const fs::path& path) {
  // Paths stay relative to the manifest's folder (regen runs there), so what a policy records
  // (model_path, the calibration file's name) is the same in every checkout.
  Manifest manifest = parse_manifest(read_text_file(path), path.string(), fs::path());
  manifest.folder = fs::absolute(path).parent_path().lexically_normal();
  return manifest;
}

}  // namespace headwise::regen
