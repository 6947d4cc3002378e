// Decoder: chunked prefill and greedy decode over a GroupedCache. See decoder.hpp.
#include "headwise/runtime/decoder.hpp"

#include <c10/core/InferenceMode.h>

#include "headwise/core/error.hpp"

namespace headwise::runtime {

std::optional<EvictionOptions> policy_selection(const policy::Policy& policy) {
  if (!policy.selects_tokens()) return std::nullopt;
  // The eviction cache runs the selecting rules h2o and snap beside window heads.
  EvictionOptions o;
  o.method = EvictionMethod::kH2O;
  o.layers = policy.selecting_layers();
  o.window_heads = policy.window_heads_of_selecting_layers();
  for (const auto& layer : policy.per_layer_policies) {
    for (size_t h = 0; h < layer.kv_head_windows.size(); ++h) {
      const policy::KeepRule rule = layer.rule(h);
      if (rule == policy::KeepRule::kSnap) {
        o.snap_heads.insert({layer.layer_id, static_cast<int64_t>(h)});
      } else if (rule.selects_tokens() && rule != policy::KeepRule::kH2O) {
        throw_input_error(
            "layer {} head {}: the runtime serves the keep rules window, h2o and snap, not {}",
            layer.layer_id, h, rule.name());
      }
    }
  }
  return o;
}

Decoder::Decoder(arch::DecoderModel& model, const memory::HeadWindows& windows,
                 const memory::MemoryOptions& options)
    : model_(model),
      cache_(GroupedCache::allocate(model.spec(), windows, options, model.device())),
      core_(model.spec(), cache_, model.attention_chunk()) {}

Decoder::Decoder(arch::DecoderModel& model, const memory::HeadWindows& windows,
                 const memory::MemoryOptions& options, const EvictionOptions& eviction)
    : model_(model),
      cache_(GroupedCache::allocate(model.spec(), windows, options, model.device(),
                                    evicted_layers(model.spec(), eviction))),
      core_(model.spec(), cache_, model.attention_chunk()),
      eviction_(std::make_unique<EvictionCache>(
          EvictionCache::allocate(model.spec(), windows, options, eviction, model.device()))),
      eviction_core_(std::make_unique<EvictionAttentionCore>(*eviction_, model.attention_chunk())) {
}

void Decoder::set_attention_kernel(arch::AttentionKernel kernel) {
  core_.set_kernel(kernel);
  if (eviction_core_) eviction_core_->set_kernel(kernel);
}

int64_t Decoder::cache_bytes() const {
  return cache_.allocated_bytes() + (eviction_ ? eviction_->kv_bytes() : 0);
}

int64_t Decoder::peak_kv_bytes() const {
  return cache_bytes() + bookkeeping_bytes() + (eviction_ ? eviction_->peak_staged_bytes() : 0);
}

PrefillSchedule prefill_schedule_from_name(std::string_view name, std::string_view flag) {
  if (name == "whole") return PrefillSchedule::kWholePrompt;
  if (name == "layer") return PrefillSchedule::kLayerByLayer;
  throw_input_error("{}: expected whole or layer, got '{}'", flag, name);
}

void Decoder::reset() {
  c10::InferenceMode inference;
  // In place: the storage the memory test measures must be the storage that serves every sequence.
  for (const auto& layer : cache_.layers()) {
    for (const auto& g : layer.groups) {
      g.k.zero_();
      g.v.zero_();
    }
    if (layer.k.defined()) layer.k.zero_();
    if (layer.v.defined()) layer.v.zero_();
    // Zero recurrent/conv states are exactly a fresh sequence (HF starts from zeros too).
    for (const auto& [name, state] : layer.states) state.zero_();
  }
  if (eviction_) {
    eviction_->reset();
    eviction_core_->forget_prompt();
  }
  position_ = 0;
  last_logits_ = at::Tensor();
}

at::Tensor Decoder::run_chunk(const at::Tensor& ids) {
  const int64_t steps = ids.size(1);
  if (position_ + steps > cache_.options().context) {
    throw_input_error("sequence of {} tokens exceeds the cache context of {} tokens",
                      position_ + steps, cache_.options().context);
  }
  at::Tensor hidden = model_.embed(ids.to(model_.device()));
  for (int64_t i = 0; i < model_.spec().num_layers(); ++i) {
    LayerCache& layer = cache_.layer(i);
    arch::LayerRun run;
    // Global layers go to the eviction core when there is one; the rest keep their rings/states.
    const bool evicting = eviction_ && eviction_->layers().contains(i);
    run.attention = evicting ? static_cast<arch::AttentionCore*>(eviction_core_.get()) : &core_;
    run.state = layer.states.empty() ? nullptr : &layer.states;
    run.position_offset = position_;
    hidden = model_.run_layer(i, hidden, run);
  }
  position_ += steps;
  at::Tensor logits = model_.logits(hidden);
  last_logits_ = logits.select(1, steps - 1);
  return logits;
}

at::Tensor Decoder::prefill(const at::Tensor& ids, int64_t chunk) {
  c10::InferenceMode inference;
  HEADWISE_CHECK(ids.dim() == 2 && ids.size(0) == cache_.options().batch && ids.size(1) > 0,
                 "prefill ids {} for a cache of batch {}", arch::shape_string(ids.sizes()),
                 cache_.options().batch);
  if (chunk <= 0) throw_input_error("prefill chunk must be positive, got {}", chunk);
  // SnapKV/AdaKV and snap heads choose from the whole prompt: tell them where it ends.
  if (eviction_core_) eviction_core_->begin_prompt(position_, position_ + ids.size(1));
  std::vector<at::Tensor> parts;
  if (schedule_ == PrefillSchedule::kLayerByLayer) {
    parts = prefill_by_layer(ids, chunk);
  } else {
    for (int64_t t0 = 0; t0 < ids.size(1); t0 += chunk)
      parts.push_back(run_chunk(ids.slice(1, t0, t0 + chunk)));
    // Whole-prompt staging: every snap head held the whole prompt until now.
    if (eviction_core_) eviction_core_->end_prompt();
  }
  return parts.size() == 1 ? parts.front() : at::cat(parts, 1);
}

std::vector<at::Tensor> Decoder::prefill_by_layer(const at::Tensor& ids, int64_t chunk) {
  const int64_t steps = ids.size(1);
  if (position_ + steps > cache_.options().context) {
    throw_input_error("sequence of {} tokens exceeds the cache context of {} tokens",
                      position_ + steps, cache_.options().context);
  }
  // Every chunk through one layer before the next: each layer sees the same chunks in the same
  // order as run_chunk's, so the logits are the same; a layer's snap heads choose (and drop their
  // staging) before the next layer stages.
  std::vector<at::Tensor> hidden;
  for (int64_t t0 = 0; t0 < steps; t0 += chunk)
    hidden.push_back(model_.embed(ids.slice(1, t0, t0 + chunk).to(model_.device())));
  for (int64_t i = 0; i < model_.spec().num_layers(); ++i) {
    LayerCache& layer = cache_.layer(i);
    const bool evicting = eviction_ && eviction_->layers().contains(i);
    arch::LayerRun run;
    run.attention = evicting ? static_cast<arch::AttentionCore*>(eviction_core_.get()) : &core_;
    run.state = layer.states.empty() ? nullptr : &layer.states;
    for (size_t c = 0; c < hidden.size(); ++c) {
      run.position_offset = position_ + static_cast<int64_t>(c) * chunk;
      hidden[c] = model_.run_layer(i, hidden[c], run);
    }
    if (evicting) eviction_core_->end_prompt_layer(i);
  }
  position_ += steps;
  std::vector<at::Tensor> parts;
  for (const auto& h : hidden) parts.push_back(model_.logits(h));
  last_logits_ = parts.back().select(1, parts.back().size(1) - 1);
  return parts;
}

at::Tensor Decoder::decode_step(const at::Tensor& tokens) {
  c10::InferenceMode inference;
  HEADWISE_CHECK(tokens.dim() == 1 && tokens.size(0) == cache_.options().batch,
                 "decode tokens {} for a cache of batch {}", arch::shape_string(tokens.sizes()),
                 cache_.options().batch);
  return run_chunk(tokens.reshape({-1, 1})).select(1, 0);
}

at::Tensor Decoder::generate(int64_t n) {
  c10::InferenceMode inference;
  HEADWISE_CHECK(last_logits_.defined(), "generate before prefill");
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor next = last_logits_.argmax(-1);
    out.push_back(next.to(at::kCPU));
    if (i + 1 < n) decode_step(next);
  }
  return out.empty() ? at::empty({cache_.options().batch, 0}, at::kLong) : at::stack(out, 1);
}

}  // namespace headwise::runtime
