#pragma once
// What a calibration job resolved and loaded before its first round (calibration_job.cpp's
// constructor), shared by the job's units in calib/job/.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/calib/calibration_data.hpp"
#include "headwise/calib/calibration_job.hpp"
#include "headwise/calib/calibration_options.hpp"
#include "headwise/calib/engine.hpp"
#include "headwise/calib/resume_checkpoint.hpp"
#include "headwise/memory/memory_model.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::calib {

struct CalibrationJob::State {
  CalibrationOptions options;           // resolved (see the constructor)
  std::vector<policy::KeepRule> rules;  // the keep rules a head may take besides its window
  std::optional<EngineBytes> engine;    // whose bytes the budget counts (over `spec`)
  std::filesystem::path output;
  std::filesystem::path dir;
  arch::ModelSpec spec;
  memory::MemoryOptions mem;
  int64_t fixed = 0;
  std::vector<int64_t> unmeasured;
  CalibrationData data;
  policy::ModelFingerprint fingerprint;
  std::string model_path;
  CheckpointInputs inputs;  // inputs_sha256 and the options it covers
  std::optional<std::string>
      context_warning;          // the context exceeds the config's max_position_embeddings
  bool auto_samples = false;    // --samples auto: options.samples is the round's (run_auto)
  std::vector<int64_t> rounds;  // --samples auto: each round's sequences, so far
};

}  // namespace headwise::calib
