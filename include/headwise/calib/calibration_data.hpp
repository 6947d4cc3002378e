#pragma once
// Where calibration tokens come from: a user's JSONL file (text tokenized with the model's
// own tokenizer.json, or pre-tokenized ids) or, without --calib, the built-in synthetic
// retrieval set. Either way the policy records what was used and its sha256.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace headwise::calib {

struct CalibrationData {
  std::vector<std::vector<int64_t>> sequences;  // all of length seq_len
  std::string description;                      // file path or generator with parameters
  std::string sha256;                           // of the file, or of the generated ids
  // Per sequence, the positions whose next-token distribution the answer-aware distortion
  // scores, and the rule that chose them (recorded in the policy's provenance).
  std::vector<std::vector<int64_t>> answer_positions;
  std::string answer_rule;
};

// Records of a file carry no answer span after packing and cutting, so the answer-aware
// distortion scores the last `tail` positions of each sequence: KL to the full model there is
// what the model's own continuation of a held-out tail loses (MoA scores the model's own
// responses the same way).
inline constexpr int64_t kAnswerTailPositions = 32;
std::vector<std::vector<int64_t>> tail_answer_positions(
    const std::vector<std::vector<int64_t>>& sequences, int64_t tail);

// `needles`: the built-in set's needles per sequence (0: its own default, one per 512 tokens, 1 to
// 8); a file takes none.
CalibrationData load_calibration_data(const std::string& calib_path,
                                      const std::filesystem::path& model_dir, int64_t vocab_size,
                                      int64_t samples, int64_t seq_len, uint64_t seed,
                                      std::string_view samples_flag = "--samples",
                                      int64_t needles = 0);

// sha256 over the ids as little-endian int64, sequence after sequence.
std::string token_ids_sha256(const std::vector<std::vector<int64_t>>& sequences);

}  // namespace headwise::calib
