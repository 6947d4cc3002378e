#include "headwise/eval/duo_attention.hpp"

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>
#include <torch/optim/adam.h>

#include <algorithm>

#include "headwise/arch/attention.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/reproducible_math.hpp"

namespace headwise::eval {
namespace {

// Global layers mix full and streaming attention per KV head by the layer's gates; sliding
// layers run as they always do.
class GatedCore final : public arch::AttentionCore {
 public:
  GatedCore(const std::map<int64_t, at::Tensor>& gates, const DuoTrainingOptions& o, int64_t chunk)
      : gates_(gates), options_(o), chunk_(chunk), exact_(chunk) {}

  at::Tensor attend(const arch::AttentionInputs& in) override {
    const auto it = gates_.find(in.layer_id);
    if (in.sliding_window > 0 || it == gates_.end()) return exact_.attend(in);
    // Fused, the backward keeps no [chunk x T] probabilities (gigabytes at 8K tokens).
    const bool fused = options_.attention_kernel == arch::AttentionKernel::kFused;
    const auto attention = [fused](const arch::AttentionInputs& i, int64_t w, int64_t s,
                                   int64_t c) {
      return fused ? arch::fused_windowed_attention(i, w, s, c)
                   : arch::windowed_attention(i, w, s, c);
    };
    const at::Tensor full = attention(in, kFullWindow, 0, chunk_);
    const at::Tensor streaming =
        attention(in, options_.streaming_window, options_.sink_tokens, chunk_);
    const int64_t group = in.q.size(1) / in.k.size(1);
    // [num_kv] → one gate per query head, broadcast over [B, T, heads, head_dim].
    const at::Tensor alpha =
        it->second.repeat_interleave(group).view({1, 1, -1, 1}).to(full.scalar_type());
    return streaming + alpha * (full - streaming);
  }

 private:
  const std::map<int64_t, at::Tensor>& gates_;
  const DuoTrainingOptions& options_;
  int64_t chunk_;
  arch::ExactAttentionCore exact_;
};

// The final RMSNorm without its learned gain: each row divided by its RMS over the hidden size.
at::Tensor rms_normalised(const at::Tensor& h) {
  return h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + 1e-6);
}

struct Supervised {
  at::Tensor ids;        // [1, T]: prompt + answer without its last token (teacher forcing)
  at::Tensor rows;       // positions whose outputs are the answer tokens the model generates
  at::Tensor reference;  // full KV's hidden states there [rows, hidden], no graph
};

std::vector<Supervised> supervise(arch::DecoderModel& model,
                                  const std::vector<EvalSample>& samples) {
  const at::NoGradGuard no_grad;
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(model.device());
  arch::ExactAttentionCore exact(model.attention_chunk());
  std::vector<Supervised> out;
  for (const auto& s : samples) {
    if (s.answer.empty() || s.prompt.empty())
      throw_input_error("duo: a {} sample has no prompt or no answer", s.task);
    const TeacherForced seq = teacher_forced(s);
    Supervised sup;
    sup.ids = at::tensor(seq.tokens, long_opts).view({1, -1});
    sup.rows = at::tensor(seq.generated_rows, long_opts);
    sup.reference = rms_normalised(
        model.hidden_states(sup.ids, exact)[0].index_select(0, sup.rows).to(at::kFloat));
    out.push_back(std::move(sup));
  }
  return out;
}

}  // namespace

double duo_lr_factor(int64_t step, int64_t steps) {
  const double ramp = std::max<double>(1.0, static_cast<double>(steps / 5));
  const double up = std::max((static_cast<double>(step) + 1.0) / ramp, 0.1);
  const double down = std::max(static_cast<double>(steps - step) / ramp, 0.1);
  return std::min({1.0, up, down});
}

DuoGates train_duo_gates(arch::DecoderModel& model, const std::vector<EvalSample>& samples,
                         const DuoTrainingOptions& options) {
  if (samples.empty()) throw_input_error("duo: no samples to train the gates on");
  if (options.steps <= 0) throw_input_error("duo: steps must be positive, got {}", options.steps);
  if (options.streaming_window <= 0) {
    throw_input_error("duo: the streaming window must be positive, got {}",
                      options.streaming_window);
  }
  // Gradients flow through every layer: no inference tensors anywhere on this path.
  const c10::InferenceMode not_inference(false);
  const at::AutoGradMode grad(true);
  const std::vector<Supervised> data = supervise(model, samples);

  std::map<int64_t, at::Tensor> gates;
  std::vector<at::Tensor> parameters;
  for (int64_t id : model.spec().global_layer_ids()) {
    gates[id] = at::ones({model.spec().layer(id).attention->num_kv_heads},
                         at::TensorOptions().dtype(at::kFloat))
                    .to(model.device())
                    .requires_grad_(true);
    parameters.push_back(gates[id]);
  }
  torch::optim::Adam adam(parameters, torch::optim::AdamOptions(options.learning_rate));
  GatedCore core(gates, options, model.attention_chunk());

  DuoGates out;
  for (int64_t step = 0; step < options.steps; ++step) {
    const Supervised& s = data[static_cast<size_t>(step) % data.size()];
    adam.zero_grad();
    {
      // As DuoAttention's code: clamp, then the step's forward.
      const at::NoGradGuard no_grad;
      for (auto& p : parameters) p.clamp_(0.0, 1.0);
    }
    for (auto& group : adam.param_groups()) {
      static_cast<torch::optim::AdamOptions&>(group.options())
          .lr(options.learning_rate * duo_lr_factor(step, options.steps));
    }
    const at::Tensor hidden =
        rms_normalised(model.hidden_states(s.ids, core)[0].index_select(0, s.rows).to(at::kFloat));
    // Thread-count-free sums: the gates (and so eval's duo row) must not depend on --jobs.
    const at::Tensor distill = thread_count_independent_sum((hidden - s.reference).pow(2));
    const at::Tensor l1 = thread_count_independent_sum(at::cat(parameters).abs());
    const at::Tensor loss = distill + options.l1_weight * l1;
    loss.backward();
    adam.step();
    out.step_loss.push_back(loss.item<double>());
    spdlog::debug("duo: step {}/{} loss {:.5f} (distill {:.5f})", step + 1, options.steps,
                  out.step_loss.back(), distill.item<double>());
  }
  {
    const at::NoGradGuard no_grad;
    for (auto& p : parameters) p.clamp_(0.0, 1.0);
  }
  for (const auto& [id, g] : gates) {
    const at::Tensor values = g.detach().to(at::kDouble).cpu().contiguous();
    out.gates[id].assign(values.data_ptr<double>(), values.data_ptr<double>() + values.numel());
  }
  return out;
}

}  // namespace headwise::eval
