#pragma once
// Where calibration tokens come from: a user's JSONL file (text tokenized with the model's
// own tokenizer.json, or pre-tokenized ids) or, without --calib, the built-in synthetic
// retrieval set. Either way the policy records what was used and its sha256.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace headwise::calib {

struct CalibrationData {
  std::vector<std::vector<int64_t>> sequences;  // all of length seq_len
  std::string description;                      // file path or generator with parameters
  std::string sha256;                           // of the file, or of the generated ids
};

CalibrationData load_calibration_data(const std::string& calib_path, const std::filesystem::path& model_dir,
                                      int64_t vocab_size, int64_t samples, int64_t seq_len, uint64_t seed);

// sha256 over the ids as little-endian int64, sequence after sequence.
std::string token_ids_sha256(const std::vector<std::vector<int64_t>>& sequences);

}  // namespace headwise::calib
