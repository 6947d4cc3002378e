#pragma once
// A hand-built decoder whose attention heads have planted behaviour, for SeqCalib tests.
//
// Hidden layout (H = 16): [0] constant 1, [1] flag (1 only for token 0, always at position 0),
// [2] the "retrieved" slot written by far heads, [3..6] token content, [7..15] head outputs.
// Heads (head_dim 16: 12 rotary dims with incommensurate frequencies, 4 pass-through dims):
//  - local:   q = k = a*u on the rotary dims; the score kernel peaks sharply at distance 0, so
//             the head attends to itself and any window keeps its output.
//  - far:     q = b on a pass-through dim, k = b*flag: attends to position 0 from everywhere;
//             v = flag, written to the retrieved slot. Truncated, it loses position 0.
//  - backup:  local, plus a far query b*(1 - retrieved): it retrieves position 0 only when
//             no lower head did. Its value and output are those of a far head.
//  - uniform: q = k = 0: averages the content of its window (moderate, smooth distortion).
// No norms, no MLP: a layer adds its attention block output to the residual stream.
// The logits are the hidden state, except that a readout may amplify the retrieved slot
// (gain, after capping it): the answer then hinges on retrieval even where the retrieving
// head's block output is small, and a cap makes two retrieving heads back each other up.
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <vector>

#include "headwise/arch/model.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/memory/memory_model.hpp"

namespace headwise::test {

enum class HeadRole { kLocal, kFar, kBackup, kUniform };

struct ToyHead {
  HeadRole role;
  double out_scale = 1.0;  // scales what the head writes into the residual
};

inline constexpr int64_t kToyHidden = 16;
inline constexpr int64_t kToyHeadDim = 16;
inline constexpr int64_t kToyRotary = 12;
inline constexpr int64_t kToyVocab = 32;

inline arch::ModelSpec toy_spec(const std::vector<std::vector<ToyHead>>& layers) {
  arch::ModelSpec spec;
  spec.model_type = "toy";
  spec.hidden_size = kToyHidden;
  spec.vocab_size = kToyVocab;
  spec.dtype = DType::kFloat32;
  for (size_t i = 0; i < layers.size(); ++i) {
    arch::LayerSpec layer;
    layer.id = static_cast<int64_t>(i);
    layer.kind = arch::LayerKind::kFullAttention;
    const auto heads = static_cast<int64_t>(layers[i].size());
    layer.attention = arch::AttentionShape{heads, heads, kToyHeadDim, 0, 0};
    spec.layers.push_back(layer);
  }
  return spec;
}

// The toys' serving shape: one sequence, unpaged (a slot per token), fp32 K/V.
inline memory::MemoryOptions toy_memory_options(int64_t context) {
  memory::MemoryOptions o;
  o.context = context;
  o.batch = 1;
  o.block_size = 1;
  o.kv_dtype = DType::kFloat32;
  return o;
}

struct ToyReadout {
  double retrieved_gain = 1.0;
  double retrieved_cap = std::numeric_limits<double>::infinity();
};

class ToyModel final : public arch::DecoderModel {
 public:
  explicit ToyModel(std::vector<std::vector<ToyHead>> layers, ToyReadout readout = {})
      : DecoderModel(toy_spec(layers), nullptr, arch::ModelOptions{}),
        layers_(std::move(layers)),
        readout_(readout) {
    at::manual_seed(1234);
    embedding_ = at::zeros({kToyVocab, kToyHidden});
    embedding_.select(1, 0).fill_(1.0);
    embedding_.slice(0, 1).slice(1, 3, 7).copy_(at::randn({kToyVocab - 1, 4}));
    embedding_[0][1] = 1.0;
    // Frequencies chosen so no distance 1..4096 brings all cosines back near 1 at once.
    inv_freq_ = at::tensor(std::vector<float>{1.0F, 0.71F, 0.453F, 0.297F, 0.1931F, 0.1237F});
  }

  at::Tensor embed(const at::Tensor& ids) override {
    return embedding_.index_select(0, ids.flatten()).view({ids.size(0), ids.size(1), kToyHidden});
  }
  at::Tensor logits(const at::Tensor& hidden) override {
    // Out of place: the answer-grad measure back-propagates through this.
    const at::Tensor h = hidden.to(at::kFloat);
    const at::Tensor retrieved =
        at::clamp_max(h.slice(-1, 2, 3), readout_.retrieved_cap) * readout_.retrieved_gain;
    return at::cat({h.slice(-1, 0, 2), retrieved, h.slice(-1, 3)}, -1);
  }
  std::vector<arch::WeightRequirement> required_weights() const override { return {}; }

  at::Tensor run_layer(int64_t layer, const at::Tensor& hidden,
                       const arch::LayerRun& run) override {
    const auto& heads = layers_[static_cast<size_t>(layer)];
    const int64_t batch = hidden.size(0), steps = hidden.size(1),
                  nh = static_cast<int64_t>(heads.size());
    const auto rope = arch::rotary_table(inv_freq_, run.position_offset, steps, 1.0, at::kFloat);
    std::vector<at::Tensor> qs, ks, vs;
    at::Tensor o_proj = at::zeros({kToyHidden, nh * kToyHeadDim});
    for (int64_t h = 0; h < nh; ++h) {
      const auto [q, k, v] = head_qkv(heads[static_cast<size_t>(h)], hidden);
      qs.push_back(q);
      ks.push_back(k);
      vs.push_back(v);
      write_output(heads[static_cast<size_t>(h)], h, o_proj);
    }
    arch::AttentionInputs in;
    in.layer_id = layer;
    in.q = arch::apply_rotary(at::stack(qs, 1), rope);  // [B, nh, T, hd]
    in.k = arch::apply_rotary(at::stack(ks, 1), rope);
    in.v = at::stack(vs, 1);
    in.scaling = 1.0;
    in.position_offset = run.position_offset;
    in.o_proj_weight = o_proj;
    arch::ExactAttentionCore exact;
    const at::Tensor attn = (run.attention ? run.attention : &exact)->attend(in);  // [B, T, nh, hd]
    return hidden + at::matmul(attn.reshape({batch, steps, nh * kToyHeadDim}), o_proj.t());
  }

 private:
  static constexpr double kLocalScale = 6.3;  // a: self score a^2 = 40
  static constexpr double kFarScale = 10.95;  // b: flag score b^2 = 120 beats any local score

  // [B, T, hd] each, before RoPE.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> head_qkv(const ToyHead& head,
                                                          const at::Tensor& x) const {
    const auto shape = std::vector<int64_t>{x.size(0), x.size(1), kToyHeadDim};
    at::Tensor q = at::zeros(shape), k = at::zeros(shape), v = at::zeros(shape);
    const at::Tensor one = x.select(2, 0), flag = x.select(2, 1), retrieved = x.select(2, 2);
    const bool local = head.role == HeadRole::kLocal || head.role == HeadRole::kBackup;
    if (local) {
      // Only the first half of each rotary pair: q.k = a^2 * mean_p cos(theta_p * distance).
      for (int64_t p = 0; p < kToyRotary / 2; ++p) {
        q.select(2, p).copy_(one * kLocalScale / std::sqrt(6.0));
        k.select(2, p).copy_(one * kLocalScale / std::sqrt(6.0));
      }
    }
    if (head.role == HeadRole::kFar || head.role == HeadRole::kBackup) {
      const at::Tensor want = head.role == HeadRole::kFar ? one : one - retrieved;
      q.select(2, kToyRotary).copy_(want * kFarScale);
      k.select(2, kToyRotary).copy_(flag * kFarScale);
      v.select(2, 0).copy_(flag);
    } else {
      v.slice(2, 0, 4).copy_(x.slice(2, 3, 7));
    }
    return {q, k, v};
  }

  static void write_output(const ToyHead& head, int64_t h, at::Tensor& o_proj) {
    const int64_t col = h * kToyHeadDim;
    if (head.role == HeadRole::kFar || head.role == HeadRole::kBackup) {
      o_proj[2][col] = head.out_scale;
    } else {
      const int64_t slot = 7 + (h * 4) % 8;  // content heads write to dims 7..14
      for (int64_t d = 0; d < 4; ++d) o_proj[slot + d % 2][col + d] = head.out_scale;
    }
  }

  std::vector<std::vector<ToyHead>> layers_;
  ToyReadout readout_;
  at::Tensor embedding_;
  at::Tensor inv_freq_;
};

// Token sequences with the flag token first, random content after.
inline std::vector<std::vector<int64_t>> toy_sequences(int64_t samples, int64_t steps,
                                                       uint64_t seed) {
  at::manual_seed(seed);
  std::vector<std::vector<int64_t>> out;
  for (int64_t s = 0; s < samples; ++s) {
    const at::Tensor ids = at::randint(1, kToyVocab, {steps}, at::kLong);
    std::vector<int64_t> seq(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + steps);
    seq[0] = 0;
    out.push_back(seq);
  }
  return out;
}

}  // namespace headwise::test
