#include "headwise/measure/multiwindow.hpp"

#include <algorithm>
#include <limits>

#include "headwise/arch/attention_cuda.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/reproducible_math.hpp"

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

// One query tile's view of the inputs. q is pre-scaled by `scaling` and laid out so a tile's
// rows of one KV head are contiguous ([B, kv, g*tc, hd]): the score and PV products are then
// plain batched GEMMs over [B*kv], with no broadcast copies of K and V per query head.
struct ChunkContext {
  const arch::AttentionInputs& in;
  at::Tensor q;  // [B, kv, g*tc, hd] fp32, scaled
  at::Tensor k;  // [B, kv, T, hd] fp32
  at::Tensor v;
  int64_t group = 1;
  int64_t t0 = 0, t1 = 0;
};

// Partial over keys [k0, k1) with `blocked` ([tc, k1-k0] bool) masked out.
Partial band_partial(const ChunkContext& c, int64_t k0, int64_t k1, const at::Tensor& blocked) {
  const int64_t tc = c.t1 - c.t0;
  at::Tensor scores = at::matmul(c.q, c.k.slice(2, k0, k1).transpose(-1, -2));  // [B, kv, g*tc, n]
  if (c.in.logit_softcap > 0) scores.div_(c.in.logit_softcap).tanh_().mul_(c.in.logit_softcap);
  at::Tensor view = scores.view({scores.size(0), scores.size(1), c.group, tc, k1 - k0});
  view.masked_fill_(blocked, kNegInf);
  // Rows with no allowed key get the finite empty max (their exp() is then 0, not NaN).
  const at::Tensor m = std::get<0>(scores.max(-1, /*keepdim=*/true)).clamp_min_(kEmptyMax);
  scores.sub_(m).exp_();  // masked entries: exp(-inf) = 0
  const at::Tensor s = scores.sum(-1, /*keepdim=*/true);
  const at::Tensor o = at::matmul(scores, c.v.slice(2, k0, k1));  // [B, kv, g*tc, hd]
  return {m, s, o};
}

at::Tensor positions(int64_t begin, int64_t len, const at::Device& device) {
  return at::arange(begin, begin + len, at::TensorOptions().dtype(at::kLong).device(device));
}

// Distance band [lo, hi) (hi < 0: unbounded), excluding sink keys.
Partial distance_band(const ChunkContext& c, int64_t lo, int64_t hi, int64_t sink_tokens) {
  const int64_t offset = c.in.position_offset;
  const int64_t k0 =
      std::max<int64_t>(hi < 0 ? 0 : c.t0 - hi + 1, std::max<int64_t>(0, sink_tokens - offset));
  const int64_t k1 = std::min(c.t1, c.t1 - lo);
  if (k1 <= k0) return empty_partial(c.q);
  const auto device = c.q.device();
  const at::Tensor qp = positions(offset + c.t0, c.t1 - c.t0, device).view({-1, 1});
  const at::Tensor kp = positions(offset + k0, k1 - k0, device).view({1, -1});
  const at::Tensor d = qp - kp;
  at::Tensor blocked = d < lo;  // keys >= sink_tokens by the choice of k0
  if (hi >= 0) blocked = blocked | (d >= hi);
  return band_partial(c, k0, k1, blocked);
}

Partial sink_band(const ChunkContext& c, int64_t sink_tokens) {
  const int64_t offset = c.in.position_offset;
  const int64_t k1 = std::min(c.t1, sink_tokens - offset);
  if (k1 <= 0) return empty_partial(c.q);
  const auto device = c.q.device();
  const at::Tensor qp = positions(offset + c.t0, c.t1 - c.t0, device).view({-1, 1});
  const at::Tensor kp = positions(offset, k1, device).view({1, -1});
  return band_partial(c, 0, k1, qp < kp);
}

// [B, kv, g*tc, hd] → [B, kv, g, tc, hd], the layout callbacks receive. `sink_rows` (gpt-oss's
// learned sink logit of each row's query head, [1, kv, g*tc, 1], or undefined) joins the
// normaliser like a key whose value is zero, as arch::softmax_with_sink_logit does.
at::Tensor finish(const Partial& p, int64_t group, const at::Tensor& sink_rows) {
  const at::Tensor o = sink_rows.defined() ? p.o / (p.s + at::exp(sink_rows - p.m)) : p.o / p.s;
  return o.view({o.size(0), o.size(1), group, -1, o.size(3)});
}

// The sink logit of each row of a tile ([1, kv, g*tc, 1]), undefined without sinks.
at::Tensor tile_sink_rows(const arch::AttentionInputs& in, int64_t kv, int64_t group,
                          int64_t rows) {
  if (!in.sink_logits.defined()) return {};
  return in.sink_logits.to(at::kFloat)
      .view({1, kv, group, 1, 1})
      .expand({1, kv, group, rows, 1})
      .reshape({1, kv, group * rows, 1});
}

void check_inputs(const arch::AttentionInputs& in, const WindowLadder& ladder, int64_t sink_tokens,
                  int64_t chunk) {
  HEADWISE_CHECK(in.q.dim() == 4 && in.k.dim() == 4 && in.v.dim() == 4,
                 "q/k/v must be [B, heads, T, hd]");
  HEADWISE_CHECK(in.q.size(1) % in.k.size(1) == 0 && in.q.size(2) == in.k.size(2),
                 "attention shapes");
  HEADWISE_CHECK(!ladder.levels.empty() && chunk > 0 && sink_tokens >= 0, "ladder/chunk/sinks");
}

// Query rows per tile on the CPU path. Each band reads (band width + tile - 1) keys per row,
// so a tile much taller than the narrowest band wastes most of that band's work; a very short
// tile makes the GEMMs small. 128 rows keeps the waste on a 256-token band near 1.5x while
// the products stay large enough for the BLAS.
int64_t cpu_tile_rows(const std::vector<int64_t>& edges, int64_t chunk) {
  const int64_t narrowest = edges.empty() ? chunk : edges.front();
  return std::min(chunk, std::clamp<int64_t>(narrowest / 2, 64, 128));
}

#ifdef HEADWISE_WITH_CUDA
// The fused kernel: every level of a query chunk in one launch.
void cuda_chunks(const arch::AttentionInputs& in, const WindowLadder& ladder,
                 const std::vector<int64_t>& edges, int64_t sink_tokens, int64_t chunk,
                 const LevelOutputsFn& fn) {
  const int64_t batch = in.q.size(0), steps = in.q.size(2), hd = in.q.size(3);
  const int64_t kv = in.k.size(1), group = in.q.size(1) / kv;
  for (int64_t t0 = 0; t0 < steps; t0 += chunk) {
    const int64_t t1 = std::min(steps, t0 + chunk);
    const at::Tensor all =
        arch::cuda_multiwindow_levels(in, edges, sink_tokens, t0, t1);  // [E+1, B, H, tc, hd]
    std::vector<at::Tensor> levels;
    for (int64_t e = 0; e < all.size(0); ++e)
      levels.push_back(all[e].view({batch, kv, group, t1 - t0, hd}));
    const at::Tensor full = levels.back();
    if (!ladder.has_full()) levels.pop_back();
    fn(t0, t1, levels, full);
  }
}
#endif

}  // namespace

void for_each_chunk_levels(const arch::AttentionInputs& in, const WindowLadder& ladder,
                           int64_t sink_tokens, int64_t chunk, const LevelOutputsFn& fn) {
  check_inputs(in, ladder, sink_tokens, chunk);
  const int64_t batch = in.q.size(0), heads = in.q.size(1), steps = in.q.size(2), hd = in.q.size(3);
  const int64_t kv = in.k.size(1), group = heads / kv;
  std::vector<int64_t> edges;  // finite windows, ascending
  for (int64_t w : ladder.levels) {
    if (w != kFullWindow) edges.push_back(w);
  }
#ifdef HEADWISE_WITH_CUDA
  if (arch::cuda_multiwindow_supported(in, edges.size()))
    return cuda_chunks(in, ladder, edges, sink_tokens, chunk, fn);
#endif
  const at::Tensor q = (in.q.to(at::kFloat) * in.scaling).view({batch, kv, group, steps, hd});
  const at::Tensor k = in.k.to(at::kFloat).contiguous();
  const at::Tensor v = in.v.to(at::kFloat).contiguous();
  const int64_t tile = cpu_tile_rows(edges, chunk);
  for (int64_t t0 = 0; t0 < steps; t0 += tile) {
    const int64_t t1 = std::min(steps, t0 + tile);
    const at::Tensor qc = q.slice(3, t0, t1).reshape({batch, kv, group * (t1 - t0), hd});
    ChunkContext c{in, qc, k, v, group, t0, t1};
    const at::Tensor sink_rows = tile_sink_rows(in, kv, group, t1 - t0);
    // The running partial after edges[j] is the prefix merge of the bands below edges[j].
    Partial running = sink_band(c, sink_tokens);
    std::vector<at::Tensor> levels;
    int64_t lo = 0;
    for (int64_t edge : edges) {
      running = merge(running, distance_band(c, lo, edge, sink_tokens));
      levels.push_back(finish(running, group, sink_rows));
      lo = edge;
    }
    running = merge(running, distance_band(c, lo, -1, sink_tokens));
    const at::Tensor full = finish(running, group, sink_rows);
    if (ladder.has_full()) levels.push_back(full);
    fn(t0, t1, levels, full);
  }
}

at::Tensor all_window_outputs(const arch::AttentionInputs& in, const WindowLadder& ladder,
                              int64_t sink_tokens, int64_t chunk) {
  const int64_t batch = in.q.size(0), heads = in.q.size(1), steps = in.q.size(2), hd = in.q.size(3);
  at::Tensor out = at::empty({static_cast<int64_t>(ladder.size()), batch, steps, heads, hd},
                             in.q.options().dtype(at::kFloat));
  for_each_chunk_levels(in, ladder, sink_tokens, chunk,
                        [&](int64_t t0, int64_t t1, const auto& levels, const auto&) {
                          for (size_t l = 0; l < levels.size(); ++l) {
                            // [B, kv, g, tc, hd] → [B, tc, heads, hd]
                            out[static_cast<int64_t>(l)].slice(1, t0, t1).copy_(
                                levels[l].reshape({batch, heads, t1 - t0, hd}).transpose(1, 2));
                          }
                        });
  return out;
}

at::Tensor measure_window_distortion(const arch::AttentionInputs& in, const WindowLadder& ladder,
                                     int64_t sink_tokens, int64_t chunk,
                                     DistortionAccumulator& acc) {
  const int64_t batch = in.q.size(0), heads = in.q.size(1), steps = in.q.size(2), hd = in.q.size(3);
  const int64_t kv = in.k.size(1), group = heads / kv;
  HEADWISE_CHECK(in.o_proj_weight.defined() && in.o_proj_weight.size(1) == heads * hd,
                 "measuring needs o_proj_weight [hidden, heads*hd]");
  HEADWISE_CHECK(
      acc.num_kv_heads() == kv && acc.num_levels() == static_cast<int64_t>(ladder.size()),
      "accumulator shape");
  const int64_t hidden = in.o_proj_weight.size(0);
  // Wo columns of each KV head's query group: [kv, g*hd, hidden].
  const at::Tensor wo =
      in.o_proj_weight.to(at::kFloat).view({hidden, kv, group * hd}).permute({1, 2, 0});
  // ||Wo_h d||^2 = d^T (Wo_h^T Wo_h) d: with the Gram matrix the per-level error costs
  // (g*hd)^2 per row instead of g*hd*hidden, a large saving when hidden >> g*hd (GQA).
  const bool use_gram = group * hd < hidden;
  const at::Tensor gram =
      use_gram ? at::bmm(wo, wo.transpose(1, 2)) : at::Tensor();  // [kv, g*hd, g*hd]
  at::Tensor out = at::empty({batch, steps, heads, hd}, in.q.options());
  for_each_chunk_levels(
      in, ladder, sink_tokens, chunk,
      [&](int64_t t0, int64_t t1, const auto& levels, const at::Tensor& full) {
        const int64_t tc = t1 - t0;
        at::Tensor gate;  // [B, kv, g, tc, hd]
        if (in.output_gate.defined()) {
          gate = in.output_gate.slice(1, t0, t1)
                     .to(at::kFloat)
                     .transpose(1, 2)
                     .reshape({batch, kv, group, tc, hd});
        }
        auto per_head_rows = [&](const at::Tensor& a) {  // [B, kv, g, tc, hd] → [kv, B*tc, g*hd]
          const at::Tensor gated = gate.defined() ? a * gate : a;
          return gated.permute({1, 0, 3, 2, 4}).reshape({kv, batch * tc, group * hd});
        };
        const at::Tensor y_full = at::bmm(per_head_rows(full), wo).sum(0);  // [B*tc, hidden]
        // Every sum of this chunk goes to the host in one copy (one device sync on CUDA).
        // One output: ATen would split it by thread (reproducible_math.hpp), the per-head sums
        // below not.
        std::vector<at::Tensor> sums{
            thread_count_independent_sum(y_full.to(at::kDouble).pow(2)).view({1})};
        for (const auto& level : levels) {
          const at::Tensor delta = per_head_rows(level - full);  // [kv, B*tc, g*hd]
          sums.push_back((use_gram ? (at::bmm(delta, gram) * delta).to(at::kDouble)
                                   : at::bmm(delta, wo).to(at::kDouble).pow(2))
                             .sum({1, 2}));
        }
        const at::Tensor host = at::cat(sums).cpu();
        const double* values = host.data_ptr<double>();
        acc.add_reference(values[0], batch * tc);
        for (size_t l = 0; l < levels.size(); ++l) {
          for (int64_t h = 0; h < kv; ++h) {
            // The Gram form is a quadratic form in fp32: clamp the rounding of an exact 0 at 0.
            // (Not std::max: it would turn a NaN into 0 and hide a corrupt head from check_finite.)
            const double error = values[1 + static_cast<int64_t>(l) * kv + h];
            acc.add_error(h, static_cast<int64_t>(l), error < 0.0 ? 0.0 : error);
          }
        }
        out.slice(1, t0, t1).copy_(full.reshape({batch, heads, tc, hd}).transpose(1, 2));
      });
  return out;
}

}  // namespace headwise::measure
