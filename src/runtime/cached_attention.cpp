// CachedAttentionCore: attention over what the grouped cache physically holds. See decoder.hpp.
#include <algorithm>
#include <limits>

#include "headwise/arch/visible_keys.hpp"
#include "headwise/core/error.hpp"
#include "headwise/runtime/decoder.hpp"

namespace headwise::runtime {
namespace {

// A ring of `sinks` fixed slots followed by `ring` slots reused modulo `ring` (grouped_cache.hpp).
struct RingLayout {
  int64_t sinks = 0;
  int64_t ring = 0;
};

// Absolute positions held in the used slots [0, n) after `filled` positions were written;
// used slots are always a prefix because sinks fill first and the ring fills in order.
at::Tensor held_positions(const RingLayout& r, int64_t filled, const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const int64_t n_sinks = std::min(filled, r.sinks);
  const int64_t n_ring = std::min(std::max<int64_t>(filled - r.sinks, 0), r.ring);
  const at::Tensor sinks = at::arange(n_sinks, opts);
  if (n_ring == 0) return sinks;
  // Slot sinks + j holds the latest position p < filled with (p - sinks) mod ring == j.
  const at::Tensor j = at::arange(n_ring, opts);
  const at::Tensor latest =
      r.sinks + j + r.ring * at::floor_divide(filled - 1 - r.sinks - j, r.ring);
  return at::cat({sinks, latest});
}

// Writes the new keys/values of positions [filled, filled + T) into `k_buf`/`v_buf`
// ([B, heads, slots, hd]). Only the positions the ring keeps are written, once each: a chunk
// longer than the ring leaves just its last `ring` positions, exactly as token-by-token
// writing would.
void write_ring(const RingLayout& r, int64_t filled, const at::Tensor& new_k,
                const at::Tensor& new_v, at::Tensor& k_buf, at::Tensor& v_buf) {
  const int64_t steps = new_k.size(2);
  const auto opts = at::TensorOptions().dtype(at::kLong).device(k_buf.device());
  const int64_t sink_end = std::min(filled + steps, r.sinks);
  if (filled < sink_end) {
    const at::Tensor slots = at::arange(filled, sink_end, opts);
    k_buf.index_copy_(2, slots, new_k.slice(2, 0, sink_end - filled).to(k_buf.scalar_type()));
    v_buf.index_copy_(2, slots, new_v.slice(2, 0, sink_end - filled).to(v_buf.scalar_type()));
  }
  const int64_t ring_begin = std::max({filled, r.sinks, filled + steps - r.ring});
  if (ring_begin >= filled + steps) return;
  HEADWISE_CHECK(r.ring > 0, "position {} has no ring slot (sinks {}, ring 0)", ring_begin,
                 r.sinks);
  const at::Tensor positions = at::arange(ring_begin, filled + steps, opts);
  const at::Tensor slots = r.sinks + at::remainder(positions - r.sinks, r.ring);
  k_buf.index_copy_(2, slots, new_k.slice(2, ring_begin - filled, steps).to(k_buf.scalar_type()));
  v_buf.index_copy_(2, slots, new_v.slice(2, ring_begin - filled, steps).to(v_buf.scalar_type()));
}

struct KeySet {
  at::Tensor k, v;      // [B, hk, N, hd] in the query dtype
  at::Tensor position;  // [N] absolute positions
};

// Softmax attention of q [B, hk, g, T, hd] (positions q_begin..) over an explicit key set, the
// keys arch::visible_keys allows (causal, within `window`, or a sink). Without sink logits or
// soft-capping it runs ATen's fused attention (arch::fused_masked_attention); otherwise numerics as
// windowed_attention: scores in the activation dtype, softmax in fp32, probabilities cast back
// before V.
at::Tensor attend_keys(const at::Tensor& q, const KeySet& keys, int64_t q_begin, int64_t window,
                       int64_t sinks, const arch::AttentionInputs& in,
                       const at::Tensor& sink_logits, int64_t chunk, arch::AttentionKernel kernel) {
  const int64_t batch = q.size(0), hk = q.size(1), group = q.size(2), steps = q.size(3),
                head_dim = q.size(4);
  const at::Tensor k = keys.k.unsqueeze(2);  // [B, hk, 1, N, hd]
  const at::Tensor v = keys.v.unsqueeze(2);
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(q.device());
  const bool fused =
      kernel == arch::AttentionKernel::kFused && !sink_logits.defined() && in.logit_softcap <= 0;
  at::Tensor out = at::empty(q.sizes(), q.options());
  for (int64_t t0 = 0; t0 < steps; t0 += chunk) {
    const int64_t t1 = std::min(steps, t0 + chunk);
    if (fused) {
      const at::Tensor allowed = arch::visible_keys(
          at::arange(q_begin + t0, q_begin + t1, long_opts), keys.position, window, sinks);
      const at::Tensor qc = q.slice(3, t0, t1).reshape({batch, hk * group, t1 - t0, head_dim});
      out.slice(3, t0, t1).copy_(
          arch::fused_masked_attention(qc, keys.k, keys.v, allowed, in.scaling)
              .reshape({batch, hk, group, t1 - t0, head_dim}));
      continue;
    }
    at::Tensor scores =
        at::matmul(q.slice(3, t0, t1), k.transpose(-1, -2)) * in.scaling;  // [B, hk, g, tc, N]
    if (in.logit_softcap > 0) scores = at::tanh(scores / in.logit_softcap) * in.logit_softcap;
    const at::Tensor allowed = arch::visible_keys(at::arange(q_begin + t0, q_begin + t1, long_opts),
                                                  keys.position, window, sinks);
    const at::Tensor logits =
        scores.to(at::kFloat)
            .masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
    const at::Tensor probs = arch::softmax_with_sink_logit(
        logits, sink_logits.defined() ? sink_logits.view({1, hk, group, 1, 1}) : at::Tensor());
    out.slice(3, t0, t1).copy_(at::matmul(probs.to(v.scalar_type()), v));
  }
  return out;
}

// Held keys of a buffer followed by the new ones. New keys pass through the cache dtype so
// every key a query sees went through the same storage, whatever the chunking.
KeySet held_and_new(const at::Tensor& k_buf, const at::Tensor& v_buf, const at::Tensor& held_pos,
                    const at::Tensor& new_k, const at::Tensor& new_v, int64_t filled) {
  const auto dtype = new_k.scalar_type();
  const int64_t used = held_pos.size(0), steps = new_k.size(2);
  auto through_cache = [&](const at::Tensor& t) {
    return k_buf.scalar_type() == dtype ? t : t.to(k_buf.scalar_type()).to(dtype);
  };
  KeySet keys;
  keys.k = at::cat({k_buf.slice(2, 0, used).to(dtype), through_cache(new_k)}, 2);
  keys.v = at::cat({v_buf.slice(2, 0, used).to(dtype), through_cache(new_v)}, 2);
  keys.position = at::cat({held_pos, at::arange(filled, filled + steps, held_pos.options())});
  return keys;
}

}  // namespace

at::Tensor CachedAttentionCore::attend(const arch::AttentionInputs& in) {
  const int64_t batch = in.q.size(0), num_heads = in.q.size(1), steps = in.q.size(2),
                head_dim = in.q.size(3);
  const int64_t num_kv = in.k.size(1), filled = in.position_offset;
  HEADWISE_CHECK(num_heads % num_kv == 0 && in.k.size(2) == steps, "attention shapes q {} k {}",
                 arch::shape_string(in.q.sizes()), arch::shape_string(in.k.sizes()));
  const auto& o = cache_.options();
  HEADWISE_CHECK(batch == o.batch, "batch {} but the cache holds {} sequences", batch, o.batch);
  HEADWISE_CHECK(filled + steps <= o.context, "positions up to {} exceed the cache context {}",
                 filled + steps, o.context);
  const int64_t group = num_heads / num_kv;
  const at::Tensor q = in.q.reshape({batch, num_kv, group, steps, head_dim});
  LayerCache& layer = cache_.layer(in.layer_id);
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(in.q.device());

  if (in.sliding_window > 0) {
    HEADWISE_CHECK(layer.k.defined(), "layer {} is sliding but the cache holds no sliding buffer",
                   in.layer_id);
    const auto& att = *spec_.layer(in.layer_id).attention;
    const int64_t cache_tokens =
        att.sliding_cache_tokens > 0 ? att.sliding_cache_tokens : att.sliding_window;
    const RingLayout ring{0, std::min(cache_tokens, o.context)};
    const KeySet keys = held_and_new(layer.k, layer.v, held_positions(ring, filled, in.q.device()),
                                     in.k, in.v, filled);
    const at::Tensor out = attend_keys(q, keys, filled, in.sliding_window, 0, in, in.sink_logits,
                                       query_chunk_, kernel_);
    write_ring(ring, filled, in.k, in.v, layer.k, layer.v);
    return out.reshape({batch, num_heads, steps, head_dim}).transpose(1, 2).contiguous();
  }

  HEADWISE_CHECK(!layer.groups.empty(), "layer {} is global but the cache holds no head groups",
                 in.layer_id);
  at::Tensor out = at::empty({batch, num_kv, group, steps, head_dim}, in.q.options());
  for (auto& g : layer.groups) {
    const at::Tensor heads = at::tensor(g.kv_heads, long_opts);
    const at::Tensor new_k = in.k.index_select(1, heads), new_v = in.v.index_select(1, heads);
    const RingLayout ring{o.sink_tokens, g.ring_length};
    const KeySet keys =
        held_and_new(g.k, g.v, held_positions(ring, filled, in.q.device()), new_k, new_v, filled);
    at::Tensor sink_logits;
    if (in.sink_logits.defined())
      sink_logits = in.sink_logits.view({num_kv, group}).index_select(0, heads);
    const int64_t sinks = g.window == kFullWindow ? 0 : o.sink_tokens;
    out.index_copy_(1, heads,
                    attend_keys(q.index_select(1, heads), keys, filled, g.window, sinks, in,
                                sink_logits, query_chunk_, kernel_));
    write_ring(ring, filled, new_k, new_v, g.k, g.v);
  }
  return out.reshape({batch, num_heads, steps, head_dim}).transpose(1, 2).contiguous();
}

}  // namespace headwise::runtime
