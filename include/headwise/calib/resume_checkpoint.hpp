#pragma once
// What a SeqCalib run has decided so far, as written to the resume checkpoint after each
// global layer: the probe pass's curves (so a resumed run skips the probe), the windows and
// curves of every global layer decided so far, the bytes spent, and the per-layer reports.
//
// Not stored: the calibration hidden states. They are samples x seq_len x hidden floats (16 GB
// for 64 x 32k x 2048) and would have to be rewritten after every layer; a resumed run instead
// replays the finished layers under their chosen windows, one plain forward pass over them,
// which recomputes the identical stream (same kernels, same inputs, same order) at a fraction
// of what measuring them cost. Doubles are stored as the exact bits (hex), so the resumed
// decisions, and the final policy, are byte-identical to an uninterrupted run.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/calib/seqcalib.hpp"
#include "headwise/dist/collective.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::calib {

struct ResumeCheckpoint {
  int64_t last_layer = -1;  // the last layer the walk finished (a global layer); -1 = none
  std::map<int64_t, std::vector<solve::Group>>
      probe_groups;  // global layer → curves with full KV below
  double probe_lambda = 0.0;
  double probe_seconds = 0.0;
  std::map<int64_t, std::vector<int64_t>> windows;  // decided so far (before completion)
  std::vector<solve::Group> decided_groups;         // conditioned curves, in decision order
  std::vector<size_t> decided_choice;
  int64_t spent = 0;
  std::vector<LayerReport> layers;  // layers 0..last_layer
};

// The inputs a checkpoint was written for: inputs_sha256, and the options it covers (by hash key:
// calibration_options.hpp, hashed_options) so that a refusal can say which flags changed.
struct CheckpointInputs {
  std::string hash;
  nlohmann::json options;
};

// The checkpoint file's text: schema, the inputs, the state.
std::string checkpoint_file_text(const CheckpointInputs& inputs, const ResumeCheckpoint& state);
// nullopt when `path` does not exist; an InputError (naming the flags that changed, when the file
// records its options) when it was written for other inputs or is not a checkpoint.
std::optional<ResumeCheckpoint> read_checkpoint_file(const std::filesystem::path& path,
                                                     const CheckpointInputs& inputs);
// Distributed: rank 0 reads (and checks) the checkpoint and sends it to the others, so the ranks
// need not share a file system.
std::optional<ResumeCheckpoint> shared_checkpoint(dist::Collective& world,
                                                  const std::filesystem::path& path,
                                                  const CheckpointInputs& inputs);

nlohmann::json resume_checkpoint_to_json(const ResumeCheckpoint& state);
// `where` names the checkpoint file in errors.
ResumeCheckpoint resume_checkpoint_from_json(const nlohmann::json& json, std::string_view where);

}  // namespace headwise::calib
