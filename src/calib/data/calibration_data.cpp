#include "headwise/calib/calibration_data.hpp"

#include <algorithm>
#include <optional>

#include "headwise/calib/calibration_file.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/tasks/synthetic.hpp"
#include "headwise/tokenize/tokenizer.hpp"

namespace headwise::calib {

std::string token_ids_sha256(const std::vector<std::vector<int64_t>>& sequences) {
  std::string bytes;
  for (const auto& seq : sequences) {
    bytes.append(reinterpret_cast<const char*>(seq.data()), seq.size() * sizeof(int64_t));
  }
  return sha256_hex(bytes);
}

std::vector<std::vector<int64_t>> tail_answer_positions(
    const std::vector<std::vector<int64_t>>& sequences, int64_t tail) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& seq : sequences) {
    const auto len = static_cast<int64_t>(seq.size());
    std::vector<int64_t> positions;
    // The last position predicts a token beyond the sequence: nothing to compare it with.
    for (int64_t t = std::max<int64_t>(0, len - 1 - tail); t < len - 1; ++t) positions.push_back(t);
    out.push_back(std::move(positions));
  }
  return out;
}

CalibrationData load_calibration_data(const std::string& calib_path,
                                      const std::filesystem::path& model_dir, int64_t vocab_size,
                                      int64_t samples, int64_t seq_len, uint64_t seed,
                                      std::string_view samples_flag, int64_t needles) {
  CalibrationData data;
  if (calib_path.empty()) {
    tasks::SyntheticOptions options{vocab_size, samples, seq_len, seed, needles};
    data.sequences = tasks::synthetic_retrieval_set(options);
    data.description = tasks::synthetic_set_description(options);
    data.sha256 = token_ids_sha256(data.sequences);
    data.answer_positions.assign(data.sequences.size(), tasks::synthetic_answer_positions(options));
    data.answer_rule = "builtin:queried-value-tokens";
    return data;
  }
  // Text records need the model's own tokenizer; pre-tokenized files do not.
  std::optional<tokenize::Tokenizer> tokenizer;
  const auto tokenizer_path = model_dir / "tokenizer.json";
  std::error_code ec;
  if (std::filesystem::exists(tokenizer_path, ec))
    tokenizer.emplace(tokenize::Tokenizer::from_file(tokenizer_path));
  CalibrationSet set = load_calibration_set(calib_path, tokenizer ? &*tokenizer : nullptr, seq_len,
                                            samples, vocab_size, samples_flag);
  data.sequences = std::move(set.sequences);
  data.description =
      fmt::format("{} ({} records, format {})", calib_path, set.records_used, set.format);
  data.sha256 = set.sha256;
  data.answer_positions = tail_answer_positions(data.sequences, kAnswerTailPositions);
  data.answer_rule = fmt::format(
      "tail:{} (KL to the full model over each sequence's last positions)", kAnswerTailPositions);
  return data;
}

}  // namespace headwise::calib
