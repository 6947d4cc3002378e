#include "calib/data/answer_positions.hpp"

#include <algorithm>

#include "headwise/core/error.hpp"

namespace headwise::calib {

MicroBatchAnswers index_answers(const std::vector<std::vector<int64_t>>& sequences,
                                const std::vector<std::vector<int64_t>>& answers,
                                int64_t micro_batch, const at::Device& device,
                                std::string_view measure) {
  const auto long_cpu = at::TensorOptions().dtype(at::kLong);
  MicroBatchAnswers out;
  for (size_t begin = 0; begin < sequences.size(); begin += static_cast<size_t>(micro_batch)) {
    const size_t end = std::min(sequences.size(), begin + static_cast<size_t>(micro_batch));
    std::vector<int64_t> rows, cols;
    for (size_t s = begin; s < end; ++s) {
      const auto len = static_cast<int64_t>(sequences[s].size());
      for (int64_t t : answers[s]) {
        if (t < 0 || t >= len) {
          throw_input_error(
              "{}: answer position {} of calibration sequence {} is outside its {} tokens", measure,
              t, s, len);
        }
        rows.push_back(static_cast<int64_t>(s - begin));
        cols.push_back(t);
        out.first = std::min(out.first, t);
      }
    }
    out.sequences.push_back(static_cast<int64_t>(end - begin));
    out.count += static_cast<int64_t>(rows.size());
    out.rows.push_back(at::tensor(rows, long_cpu).to(device));
    out.columns.push_back(at::tensor(cols, long_cpu).to(device));
  }
  return out;
}

}  // namespace headwise::calib
