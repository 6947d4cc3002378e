#include "headwise/measure/multiwindow.hpp"

#include <algorithm>
#include <limits>

#include "headwise/core/error.hpp"

namespace headwise::measure {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
// Empty bands get this finite max so merging two empty partials gives 0, not NaN.
constexpr double kEmptyMax = -1e30;

// Online-softmax partial of one band: o and s are scaled by exp(-m).
struct Partial {
  at::Tensor m;  // [B, kv, g, tc, 1]
  at::Tensor s;  // [B, kv, g, tc, 1]
  at::Tensor o;  // [B, kv, g, tc, hd]
};

Partial merge(const Partial& a, const Partial& b) {
  const at::Tensor m = at::maximum(a.m, b.m);
  const at::Tensor ea = at::exp(a.m - m);
  const at::Tensor eb = at::exp(b.m - m);
  return {m, a.s * ea + b.s * eb, a.o * ea + b.o * eb};
}

Partial empty_partial(const at::Tensor& q_chunk) {
  auto sizes = q_chunk.sizes().vec();
  const at::Tensor o = at::zeros(sizes, q_chunk.options());
  sizes.back() = 1;
  return {at::full(sizes, kEmptyMax, q_chunk.options()), at::zeros(sizes, q_chunk.options()), o};
}

struct ChunkContext {
  const arch::AttentionInputs& in;
  at::Tensor q;  // [B, kv, g, tc, hd] fp32
  at::Tensor k;  // [B, kv, 1, T, hd] fp32
  at::Tensor v;
  int64_t t0 = 0, t1 = 0;
};

// Partial over keys [k0, k1) restricted to `allowed` ([tc, k1-k0] bool).
Partial band_partial(const ChunkContext& c, int64_t k0, int64_t k1, const at::Tensor& allowed) {
  const at::Tensor kc = c.k.slice(3, k0, k1);
  const at::Tensor vc = c.v.slice(3, k0, k1);
  at::Tensor scores = at::matmul(c.q, kc.transpose(-1, -2)) * c.in.scaling;
  if (c.in.logit_softcap > 0) scores = at::tanh(scores / c.in.logit_softcap) * c.in.logit_softcap;
  scores = scores.masked_fill(allowed.logical_not(), kNegInf);
  at::Tensor m = std::get<0>(scores.max(-1, /*keepdim=*/true));
  m = at::where(at::isinf(m), at::full_like(m, kEmptyMax), m);
  const at::Tensor e = at::exp(scores - m);  // masked entries: exp(-inf) = 0
  return {m, e.sum(-1, /*keepdim=*/true), at::matmul(e, vc)};
}

at::Tensor positions(int64_t begin, int64_t len, const at::Device& device) {
  return at::arange(begin, begin + len, at::TensorOptions().dtype(at::kLong).device(device));
}

// Distance band [lo, hi) (hi < 0: unbounded), excluding sink keys.
Partial distance_band(const ChunkContext& c, int64_t lo, int64_t hi, int64_t sink_tokens) {
  const int64_t offset = c.in.position_offset;
  const int64_t k0 = hi < 0 ? 0 : std::max<int64_t>(0, c.t0 - hi + 1);
  const int64_t k1 = std::min(c.t1, c.t1 - lo);
  if (k1 <= k0) return empty_partial(c.q);
  const auto device = c.q.device();
  const at::Tensor qp = positions(offset + c.t0, c.t1 - c.t0, device).view({-1, 1});
  const at::Tensor kp = positions(offset + k0, k1 - k0, device).view({1, -1});
  const at::Tensor d = qp - kp;
  at::Tensor allowed = (d >= lo) & (kp >= sink_tokens);
  if (hi >= 0) allowed = allowed & (d < hi);
  return band_partial(c, k0, k1, allowed);
}

Partial sink_band(const ChunkContext& c, int64_t sink_tokens) {
  const int64_t offset = c.in.position_offset;
  const int64_t k1 = std::min(c.t1, sink_tokens - offset);
  if (k1 <= 0) return empty_partial(c.q);
  const auto device = c.q.device();
  const at::Tensor qp = positions(offset + c.t0, c.t1 - c.t0, device).view({-1, 1});
  const at::Tensor kp = positions(offset, k1, device).view({1, -1});
  return band_partial(c, 0, k1, qp >= kp);
}

at::Tensor finish(const Partial& p) { return p.o / p.s; }

void check_inputs(const arch::AttentionInputs& in, const WindowLadder& ladder, int64_t sink_tokens, int64_t chunk) {
  HEADWISE_CHECK(in.q.dim() == 4 && in.k.dim() == 4 && in.v.dim() == 4, "q/k/v must be [B, heads, T, hd]");
  HEADWISE_CHECK(in.q.size(1) % in.k.size(1) == 0 && in.q.size(2) == in.k.size(2), "attention shapes");
  HEADWISE_CHECK(!ladder.levels.empty() && chunk > 0 && sink_tokens >= 0, "ladder/chunk/sinks");
  HEADWISE_CHECK(!in.sink_logits.defined(), "learned sink logits are not supported by the multi-window pass");
}

}  // namespace

void for_each_chunk_levels(const arch::AttentionInputs& in, const WindowLadder& ladder, int64_t sink_tokens,
                           int64_t chunk, const LevelOutputsFn& fn) {
  check_inputs(in, ladder, sink_tokens, chunk);
  const int64_t batch = in.q.size(0), heads = in.q.size(1), steps = in.q.size(2), hd = in.q.size(3);
  const int64_t kv = in.k.size(1), group = heads / kv;
  std::vector<int64_t> edges;  // finite windows, ascending
  for (int64_t w : ladder.levels) {
    if (w != kFullWindow) edges.push_back(w);
  }
  const at::Tensor q = in.q.to(at::kFloat).view({batch, kv, group, steps, hd});
  const at::Tensor k = in.k.to(at::kFloat).unsqueeze(2);
  const at::Tensor v = in.v.to(at::kFloat).unsqueeze(2);
  for (int64_t t0 = 0; t0 < steps; t0 += chunk) {
    const int64_t t1 = std::min(steps, t0 + chunk);
    ChunkContext c{in, q.slice(3, t0, t1), k, v, t0, t1};
    // prefix[j] merges the sink band and distance bands below edges[j].
    Partial running = sink_band(c, sink_tokens);
    std::vector<at::Tensor> finite_levels;
    int64_t lo = 0;
    for (int64_t edge : edges) {
      running = merge(running, distance_band(c, lo, edge, sink_tokens));
      finite_levels.push_back(finish(running));
      lo = edge;
    }
    running = merge(running, distance_band(c, lo, -1, sink_tokens));
    const at::Tensor full = finish(running);
    std::vector<at::Tensor> levels = finite_levels;
    if (ladder.has_full()) levels.push_back(full);
    fn(t0, t1, levels, full);
  }
}

at::Tensor all_window_outputs(const arch::AttentionInputs& in, const WindowLadder& ladder, int64_t sink_tokens,
                              int64_t chunk) {
  const int64_t batch = in.q.size(0), heads = in.q.size(1), steps = in.q.size(2), hd = in.q.size(3);
  at::Tensor out = at::empty({static_cast<int64_t>(ladder.size()), batch, steps, heads, hd},
                             in.q.options().dtype(at::kFloat));
  for_each_chunk_levels(in, ladder, sink_tokens, chunk, [&](int64_t t0, int64_t t1, const auto& levels, const auto&) {
    for (size_t l = 0; l < levels.size(); ++l) {
      // [B, kv, g, tc, hd] → [B, tc, heads, hd]
      out[static_cast<int64_t>(l)].slice(1, t0, t1).copy_(
          levels[l].reshape({batch, heads, t1 - t0, hd}).transpose(1, 2));
    }
  });
  return out;
}

at::Tensor measure_window_distortion(const arch::AttentionInputs& in, const WindowLadder& ladder,
                                     int64_t sink_tokens, int64_t chunk, DistortionAccumulator& acc) {
  const int64_t batch = in.q.size(0), heads = in.q.size(1), steps = in.q.size(2), hd = in.q.size(3);
  const int64_t kv = in.k.size(1), group = heads / kv;
  HEADWISE_CHECK(in.o_proj_weight.defined() && in.o_proj_weight.size(1) == heads * hd,
                 "measuring needs o_proj_weight [hidden, heads*hd]");
  HEADWISE_CHECK(acc.num_kv_heads() == kv && acc.num_levels() == static_cast<int64_t>(ladder.size()),
                 "accumulator shape");
  const int64_t hidden = in.o_proj_weight.size(0);
  // Wo columns of each KV head's query group: [kv, g*hd, hidden].
  const at::Tensor wo = in.o_proj_weight.to(at::kFloat).view({hidden, kv, group * hd}).permute({1, 2, 0});
  at::Tensor out = at::empty({batch, steps, heads, hd}, in.q.options());
  for_each_chunk_levels(in, ladder, sink_tokens, chunk, [&](int64_t t0, int64_t t1, const auto& levels,
                                                             const at::Tensor& full) {
    const int64_t tc = t1 - t0;
    at::Tensor gate;  // [B, kv, g, tc, hd]
    if (in.output_gate.defined()) {
      gate = in.output_gate.slice(1, t0, t1).to(at::kFloat).transpose(1, 2).reshape({batch, kv, group, tc, hd});
    }
    auto per_head_rows = [&](const at::Tensor& a) {  // [B, kv, g, tc, hd] → [kv, B*tc, g*hd]
      const at::Tensor gated = gate.defined() ? a * gate : a;
      return gated.permute({1, 0, 3, 2, 4}).reshape({kv, batch * tc, group * hd});
    };
    const at::Tensor y_full = at::bmm(per_head_rows(full), wo).sum(0);  // [B*tc, hidden]
    acc.add_reference(y_full.to(at::kDouble).pow(2).sum().item<double>(), batch * tc);
    for (size_t l = 0; l < levels.size(); ++l) {
      const at::Tensor err = at::bmm(per_head_rows(levels[l] - full), wo);  // [kv, B*tc, hidden]
      const at::Tensor per_head = err.to(at::kDouble).pow(2).sum({1, 2}).cpu();
      const double* values = per_head.data_ptr<double>();
      for (int64_t h = 0; h < kv; ++h) acc.add_error(h, static_cast<int64_t>(l), values[h]);
    }
    out.slice(1, t0, t1).copy_(full.reshape({batch, heads, tc, hd}).transpose(1, 2));
  });
  return out;
}

}  // namespace headwise::measure
