#pragma once
// Curves files: the per-head rate-distortion options that calibration measured, stored so
// `headwise-calc solve` can re-solve for another budget without a model. Shape:
//   {"heads": [{"layer_id": L, "kv_head": h,
//               "options": [{"window": 4096 | "full", "bytes": N, "distortion": x}, ...]}, ...]}
// Other top-level keys are ignored: calibration reports embed the curves among more data.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "headwise/solve/mckp.hpp"

namespace headwise::solve {

// `source` names the file in errors, which also give the key path (heads[3].options[1].bytes).
// The groups are validated (validate_groups).
std::vector<Group> groups_from_json(const nlohmann::json& document, const std::string& source);
std::vector<Group> read_curves_file(const std::filesystem::path& path);

// The inverse of groups_from_json (window kFullWindow written as "full").
nlohmann::json groups_to_json(const std::vector<Group>& groups);

// {"total_bytes", "total_distortion", "proven_optimal", "choices": [{"layer_id", "kv_head",
// "window"}]}
nlohmann::json solution_to_json(const std::vector<Group>& groups, const SolveResult& result);

}  // namespace headwise::solve
