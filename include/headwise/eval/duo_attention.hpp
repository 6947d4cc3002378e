#pragma once
// DuoAttention (Xiao et al., 2024) as an eval baseline: a gate alpha in [0, 1] per KV head of
// every global layer mixes that head's full attention with streaming attention (sinks + recent
// window),
//
//   out_h = alpha_h * full_h + (1 - alpha_h) * streaming_h,
//
// and the gates are optimised by gradient descent (Adam, libtorch autograd through every layer)
// to keep the final hidden states at the answer positions of retrieval samples equal to full
// KV's, with an L1 penalty pushing gates to 0:
//
//   loss = |H_mixed - H_full|^2 / |H_full|^2  (over answer positions)  +  l1 * mean(alpha).
//
// Heads are then ranked by gate (retrieval heads first) and cut to the byte budget. As in the
// paper: gates start at 1, are clamped to [0, 1] after every step, lr 0.02, l1 weight 0.05;
// the supervision is the answer (passkey) tokens after the context, the context positions
// excluded. Two deviations, both stated: the hidden states are taken before the final norm
// (the per-layer API ends there) and the distillation term is divided by |H_full|^2, so the
// penalty weight keeps its meaning on a model whose hidden states are not normalised; the step
// count is small (the eval budget of a CPU), and the report records it.
#include <cstdint>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/arch/visible_keys.hpp"
#include "headwise/eval/baselines.hpp"
#include "headwise/eval/tasks.hpp"

namespace headwise::eval {

struct DuoTrainingOptions {
  int64_t steps = 256;            // one sample per step, cycling through the samples
  double learning_rate = 0.02;    // the paper's
  double l1_weight = 0.05;        // the paper's
  int64_t streaming_window = 64;  // recent tokens a streaming head keeps
  int64_t sink_tokens = 0;        // first tokens a streaming head keeps
  // Fused: the backward keeps no [chunk x T] probabilities and runs faster (arch/attention.hpp).
  arch::AttentionKernel attention_kernel = arch::AttentionKernel::kFused;
};

struct DuoGates {
  HeadScores gates;               // global layer → gate per KV head, in [0, 1]
  std::vector<double> step_loss;  // total loss per step (the first is the gates at 1)
};

// Trains the gates on `samples` (prompt + answer, teacher-forced; samples without an answer
// are refused). Deterministic for a fixed thread count.
DuoGates train_duo_gates(arch::DecoderModel& model, const std::vector<EvalSample>& samples,
                         const DuoTrainingOptions& options);

}  // namespace headwise::eval
