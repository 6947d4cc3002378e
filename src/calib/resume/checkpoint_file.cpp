// The resume checkpoint's file (resume_checkpoint.hpp): what the job writes after each global
// layer and reads back with --resume.
#include <spdlog/spdlog.h>

#include "headwise/calib/calibration_options.hpp"
#include "headwise/calib/resume_checkpoint.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"

namespace headwise::calib {
namespace {
namespace fs = std::filesystem;

constexpr std::string_view kCheckpointSchema = "headwise/calib-checkpoint/v1";

}  // namespace

std::string checkpoint_file_text(const CheckpointInputs& inputs, const ResumeCheckpoint& state) {
  const nlohmann::json j = {{"schema", kCheckpointSchema},
                            {"inputs_sha256", inputs.hash},
                            {"options", inputs.options},
                            {"state", resume_checkpoint_to_json(state)}};
  return j.dump() + "\n";
}

std::optional<ResumeCheckpoint> read_checkpoint_file(const fs::path& path,
                                                     const CheckpointInputs& inputs) {
  const std::string& inputs_hash = inputs.hash;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    spdlog::info("{}: no checkpoint at {}; starting from the beginning", option_spelling("resume"),
                 path.string());
    return std::nullopt;
  }
  const nlohmann::json j = read_json_file(path);
  if (!j.is_object() || j.value("schema", "") != kCheckpointSchema ||
      !j.contains("inputs_sha256") || !j.contains("state")) {
    throw_input_error(
        "{}: not a headwise calibration checkpoint (schema {}); delete it and rerun without {}",
        path.string(), kCheckpointSchema, option_spelling("resume"));
  }
  const std::string recorded =
      j["inputs_sha256"].is_string() ? j["inputs_sha256"].get<std::string>() : "";
  if (recorded != inputs_hash) {
    const std::vector<std::string> changed = j.contains("options")
                                                 ? changed_options(j["options"], inputs.options)
                                                 : std::vector<std::string>();
    throw_input_error(
        "{}: checkpoint was written for different inputs (inputs_sha256 {} here, {} now: {}); "
        "rerun without {} to start over",
        path.string(), recorded.substr(0, 12), inputs_hash.substr(0, 12),
        changed.empty() ? std::string("model, calibration data, options or tool version changed")
                        : fmt::format("{} changed", fmt::join(changed, ", ")),
        option_spelling("resume"));
  }
  return resume_checkpoint_from_json(j["state"], path.string());
}

// Distributed: rank 0 reads (and checks) the checkpoint and sends it to the others, so the
// ranks need not share a file system.
std::optional<ResumeCheckpoint> shared_checkpoint(dist::Collective& world, const fs::path& path,
                                                  const CheckpointInputs& inputs) {
  if (world.world_size() == 1) return read_checkpoint_file(path, inputs);
  std::optional<ResumeCheckpoint> state;
  if (world.rank() == 0) state = read_checkpoint_file(path, inputs);
  const std::string text = world.all_gather(
      state ? resume_checkpoint_to_json(*state).dump() : std::string(), "the resume checkpoint")[0];
  if (world.rank() == 0 || text.empty()) return state;
  return resume_checkpoint_from_json(nlohmann::json::parse(text),
                                     "rank 0's checkpoint " + path.string());
}

}  // namespace headwise::calib
