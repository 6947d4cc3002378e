#pragma once
// The answer positions of a calibration batch, indexed per micro-batch as the answer measures
// (answer-kl/tv and their span forms) read them: a (row within the micro-batch, token position)
// pair per answer, as index tensors on the model's device.
#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

namespace headwise::calib {

struct MicroBatchAnswers {
  std::vector<int64_t> sequences;                       // sequences in each micro-batch
  std::vector<at::Tensor> rows;                         // per micro-batch: the row of each answer
  std::vector<at::Tensor> columns;                      // per micro-batch: its token position
  int64_t count = 0;                                    // answers in this process's sequences
  int64_t first = std::numeric_limits<int64_t>::max();  // their earliest position
};

// Throws InputError, prefixed with `measure`, when an answer lies outside its sequence.
MicroBatchAnswers index_answers(const std::vector<std::vector<int64_t>>& sequences,
                                const std::vector<std::vector<int64_t>>& answers,
                                int64_t micro_batch, const at::Device& device,
                                std::string_view measure);

}  // namespace headwise::calib
