#include "calib/measures/span_attention.hpp"

#include <algorithm>
#include <limits>
#include <optional>

#include "headwise/arch/model.hpp"
#include "headwise/arch/visible_keys.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/window.hpp"

namespace headwise::calib {
namespace {

// Score tiles are kept under this many bytes (fp32): the shared keys can be a whole prompt.
constexpr int64_t kTileBytes = int64_t{64} << 20;
// A row that sees no key of a set gets this finite max, so its partial adds exactly nothing.
constexpr float kEmptyMax = -1e30F;

// Online-softmax partial of a set of keys: o and s are scaled by exp(-m).
struct Partial {
  at::Tensor m;  // [..., rows, 1] fp32
  at::Tensor s;  // [..., rows, 1] fp32
  at::Tensor o;  // [..., rows, hd] fp32
};

at::Tensor positions(int64_t begin, int64_t len, const at::Device& device) {
  return at::arange(begin, begin + len, at::TensorOptions().dtype(at::kLong).device(device));
}

// Scores of q [..., rows, hd] against k [..., n, hd] as windowed_attention computes them: in the
// activation dtype, scaled, soft-capped, then fp32 with invisible pairs at -inf.
at::Tensor masked_scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& visible,
                         const SpanAttentionShape& shape) {
  at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) * shape.scaling;
  if (shape.logit_softcap > 0)
    scores = at::tanh(scores / shape.logit_softcap) * shape.logit_softcap;
  if (!visible.defined()) return scores.to(at::kFloat);
  return scores.to(at::kFloat)
      .masked_fill(visible.logical_not(), -std::numeric_limits<float>::infinity());
}

// `scores` is a temporary of the caller's: overwritten in place by its exponentials.
Partial partial_of(at::Tensor scores, const at::Tensor& v) {
  const at::Tensor m = std::get<0>(scores.max(-1, /*keepdim=*/true)).clamp_min(kEmptyMax);
  scores.sub_(m).exp_();
  return {m, scores.sum(-1, /*keepdim=*/true), at::matmul(scores, v.to(at::kFloat))};
}

// The shared keys' partial for q folded to [B, kv, rows, hd] (rows = group x C x S, position of
// row r: span_begin + r % S), in tiles of rows.
Partial shared_partial(const at::Tensor& folded, int64_t span, int64_t span_begin,
                       const KeyBlock& keys, const SpanAttentionShape& shape) {
  const int64_t batch = folded.size(0), kv = folded.size(1), rows = folded.size(2),
                n = keys.k.size(2);
  const auto device = folded.device();
  const at::Tensor row_position = span_begin + at::remainder(positions(0, rows, device), span);
  const at::Tensor key_position = positions(keys.first_position, n, device);
  const int64_t tile = std::max<int64_t>(1, kTileBytes / std::max<int64_t>(1, batch * kv * n * 4));
  // Keys before the span, every one within reach of every span query: no mask to build or apply.
  const bool all_visible = keys.first_position + n <= span_begin && shape.window == kFullWindow;
  std::vector<at::Tensor> m, s, o;
  for (int64_t r0 = 0; r0 < rows; r0 += tile) {
    const int64_t r1 = std::min(rows, r0 + tile);
    const at::Tensor visible = all_visible
                                   ? at::Tensor()
                                   : arch::visible_keys(row_position.slice(0, r0, r1), key_position,
                                                        shape.window, shape.sink_tokens);
    const Partial p =
        partial_of(masked_scores(folded.slice(2, r0, r1), keys.k, visible, shape), keys.v);
    m.push_back(p.m);
    s.push_back(p.s);
    o.push_back(p.o);
  }
  return {at::cat(m, 2), at::cat(s, 2), at::cat(o, 2)};
}

// [B * C, kv, g, S, x] (b-major rows) → [B, kv, g * C * S, x]: a KV head's query rows of every
// candidate of a sequence in one run, so the shared keys are multiplied once.
at::Tensor fold(const at::Tensor& t, int64_t batch, int64_t candidates) {
  const int64_t kv = t.size(1), group = t.size(2), span = t.size(3), x = t.size(4);
  return t.view({batch, candidates, kv, group, span, x})
      .permute({0, 2, 3, 1, 4, 5})
      .reshape({batch, kv, group * candidates * span, x});
}

}  // namespace

at::Tensor span_attention(const at::Tensor& q, int64_t span_begin, const KeyBlock& shared,
                          const KeyBlock* own, const SpanAttentionShape& shape) {
  HEADWISE_CHECK(q.dim() == 4 && shared.k.dim() == 4 && shared.k.sizes() == shared.v.sizes(),
                 "span attention shapes q {} k {}", arch::shape_string(q.sizes()),
                 arch::shape_string(shared.k.sizes()));
  const int64_t rows_total = q.size(0), heads = q.size(1), span = q.size(2), head_dim = q.size(3);
  const int64_t batch = shared.k.size(0), kv = shared.k.size(1);
  HEADWISE_CHECK(batch > 0 && rows_total % batch == 0 && heads % kv == 0,
                 "span attention: {} query rows for {} sequences", rows_total, batch);
  const int64_t candidates = rows_total / batch, group = heads / kv;
  HEADWISE_CHECK(own != nullptr || shared.k.size(2) > 0, "span attention: no keys");
  const at::Tensor grouped = q.view({rows_total, kv, group, span, head_dim});
  std::optional<Partial> total;
  if (shared.k.size(2) > 0)
    total = shared_partial(fold(grouped, batch, candidates), span, span_begin, shared, shape);
  if (own != nullptr) {
    HEADWISE_CHECK(
        own->k.size(0) == rows_total && own->k.size(2) == span && own->first_position == span_begin,
        "span attention: own keys {} for queries {}", arch::shape_string(own->k.sizes()),
        arch::shape_string(q.sizes()));
    const auto device = q.device();
    const at::Tensor visible =
        arch::visible_keys(positions(span_begin, span, device), positions(span_begin, span, device),
                           shape.window, shape.sink_tokens);
    const at::Tensor rows = grouped.reshape({rows_total, kv, group * span, head_dim});
    const at::Tensor scores = masked_scores(rows, own->k, visible.repeat({group, 1}), shape);
    const Partial mine = partial_of(scores, own->v);  // [B * C, kv, g * S, ...]
    const auto folded = [&](const at::Tensor& t) {
      return fold(t.view({rows_total, kv, group, span, t.size(-1)}), batch, candidates);
    };
    const Partial theirs{folded(mine.m), folded(mine.s), folded(mine.o)};
    if (!total) {
      total = theirs;
    } else {
      const at::Tensor m = at::maximum(total->m, theirs.m);
      const at::Tensor a = (total->m - m).exp(), b = (theirs.m - m).exp();
      total = Partial{m, total->s * a + theirs.s * b, total->o * a + theirs.o * b};
    }
  }
  at::Tensor denominator = total->s;
  if (shape.sink_logits.defined()) {
    // gpt-oss: the learned sink logit joins the normalisation and carries no value.
    const at::Tensor sink = shape.sink_logits.to(at::kFloat).view({1, kv, group, 1, 1});
    const at::Tensor per_row =
        sink.expand({batch, kv, group, candidates * span, 1}).reshape({batch, kv, -1, 1});
    denominator = denominator + (per_row - total->m).exp();
  }
  const at::Tensor out = total->o / denominator;  // [B, kv, g * C * S, hd]
  return out.view({batch, kv, group, candidates, span, head_dim})
      .permute({0, 3, 4, 1, 2, 5})
      .reshape({rows_total, span, heads, head_dim})
      .to(q.scalar_type());
}

}  // namespace headwise::calib
