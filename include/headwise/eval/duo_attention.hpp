#pragma once
// DuoAttention (Xiao et al., 2024) as an eval baseline: a gate alpha in [0, 1] per KV head of
// every global layer mixes that head's full attention with streaming attention (attention sinks
// + a recent window),
//
//   out_h = alpha_h * full_h + (1 - alpha_h) * streaming_h,
//
// and the gates are optimised by gradient descent (Adam, libtorch autograd through every layer)
// to keep the final hidden states at the answer positions of retrieval samples equal to full
// KV's, with an L1 penalty pushing gates to 0 (the paper's loss):
//
//   loss = sum over answer positions of |H_mixed - H_full|^2  +  l1 * sum over heads of |alpha|.
//
// Heads are then ranked by gate (retrieval heads first) and cut to the byte budget. As in the
// paper and its code: gates start at 1 and are clamped to [0, 1] before every step, lr 0.02 with a
// linear warm-up over the first steps/5 and a cool-down over the last steps/5 (floor 10%), l1
// weight 0.05, streaming heads keep 128 sink tokens and 256 recent ones, batch 1; the supervision
// is the answer (passkey) tokens after the context. Two deviations, both stated in the eval
// JSON: H is the last layer's output normalised by its RMS over the hidden dimension, the final
// RMSNorm without its learned gain (the per-layer API ends before the final norm; the gain only
// scales the distance per dimension); and the training data are eval's calibration samples of the
// evaluated tasks at the policy's context, not the paper's multi-passkey set at 1K-32K, for
// `steps` steps (the paper's 2,000 by default; `eval --duo-steps` sets fewer on a slow machine).
#include <cstdint>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/arch/visible_keys.hpp"
#include "headwise/eval/baselines.hpp"
#include "headwise/eval/tasks.hpp"

namespace headwise::eval {

struct DuoTrainingOptions {
  int64_t steps = 2000;            // the paper's; one sample per step, cycling through the samples
  double learning_rate = 0.02;     // the paper's peak
  double l1_weight = 0.05;         // the paper's
  int64_t streaming_window = 256;  // recent tokens a streaming head keeps (the paper's)
  int64_t sink_tokens = 128;       // first tokens a streaming head keeps (the paper's)
  // Fused: the backward keeps no [chunk x T] probabilities and runs faster (arch/attention.hpp).
  arch::AttentionKernel attention_kernel = arch::AttentionKernel::kFused;
};

struct DuoGates {
  HeadScores gates;               // global layer → gate per KV head, in [0, 1]
  std::vector<double> step_loss;  // total loss per step (the first is the gates at 1)
};

// DuoAttention's learning-rate factor at `step` of `steps`: linear warm-up over steps/5, flat, then
// a linear cool-down over the last steps/5, never below 0.1 (its training script's schedule).
double duo_lr_factor(int64_t step, int64_t steps);

// Trains the gates on `samples` (prompt + answer, teacher-forced; samples without an answer
// are refused). Deterministic for a fixed thread count.
DuoGates train_duo_gates(arch::DecoderModel& model, const std::vector<EvalSample>& samples,
                         const DuoTrainingOptions& options);

}  // namespace headwise::eval
