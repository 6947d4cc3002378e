#include "headwise/calib/answer_grad.hpp"

#include <cstring>

#include <ATen/core/grad_mode.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>

#include "headwise/arch/attention.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/reproducible_math.hpp"
#include "headwise/measure/multiwindow.hpp"

namespace headwise::calib {
namespace {

// Autograd on, whatever the caller's mode (run_seqcalib and eval run without a graph).
class DifferentiableScope {
 public:
  DifferentiableScope() = default;

 private:
  c10::InferenceMode no_inference_{false};
  at::AutoGradMode grad_{true};
};

// A fresh leaf that requires grad. Inference tensors (made under InferenceMode) are copied first:
// they cannot take part in autograd.
at::Tensor gradient_leaf(const at::Tensor& t) {
  return (t.is_inference() ? t.clone() : t.detach()).requires_grad_(true);
}

// At the measured layer: the attention output at the linearisation windows as a leaf (the
// gradients' target) and each level's change of it; every other layer as the model defines it.
class LeafCore final : public arch::AttentionCore {
 public:
  // `level(in, w)`: the layer's attention output [B, T, heads, hd] in fp32 with every head at
  // window w (cached by the caller).
  using LevelFn = std::function<at::Tensor(const arch::AttentionInputs&, int64_t window)>;
  LeafCore(int64_t layer, const std::vector<int64_t>& ladder,
           const std::vector<int64_t>& at_windows, LevelFn level, int64_t chunk)
      : layer_(layer),
        ladder_(ladder),
        at_windows_(at_windows),
        level_(std::move(level)),
        exact_(chunk) {}

  at::Tensor attend(const arch::AttentionInputs& in) override {
    if (in.layer_id != layer_ || in.sliding_window > 0) return exact_.attend(in);
    const at::NoGradGuard no_grad;
    const at::Tensor base =
        compose_heads(at_windows_, [&](int64_t window) { return level_(in, window); });
    deltas_.clear();
    for (int64_t window : ladder_) {
      const bool unchanged = std::all_of(at_windows_.begin(), at_windows_.end(),
                                         [&](int64_t w) { return w == window; });
      deltas_.push_back(unchanged ? at::Tensor() : level_(in, window) - base);
    }
    leaf_ = base.to(in.q.scalar_type()).requires_grad_(true);
    return leaf_;
  }

  const at::Tensor& leaf() const { return leaf_; }
  // [B, T, num_heads, head_dim] float, undefined for a level every head is at already.
  const at::Tensor& delta(size_t level) const { return deltas_.at(level); }

 private:
  int64_t layer_;
  const std::vector<int64_t>& ladder_;
  const std::vector<int64_t>& at_windows_;
  LevelFn level_;
  arch::ExactAttentionCore exact_;  // every other layer: exact, or sliding where it slides
  at::Tensor leaf_;
  std::vector<at::Tensor> deltas_;
};

// Vector-Jacobian products of `output` w.r.t. `input` for every cotangent, one backward each
// through the same graph.
std::vector<at::Tensor> pull_back(const at::Tensor& output, const at::Tensor& input,
                                  const std::vector<at::Tensor>& cotangents) {
  std::vector<at::Tensor> pulled;
  for (size_t c = 0; c < cotangents.size(); ++c) {
    const bool keep_graph = c + 1 < cotangents.size();
    pulled.push_back(torch::autograd::grad({output}, {input}, {cotangents[c]}, keep_graph)[0]);
  }
  return pulled;
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor cpu = t.to(at::kLong).cpu().contiguous();
  return {cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + cpu.numel()};
}

// log σ(x) and log(1 - σ(x)) without overflow.
double log_sigmoid(double x) {
  return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x));
}

// KL((q, 1-q) || (σ(m), 1-σ(m))).
double two_class_kl(double q, double m) {
  double kl = 0.0;
  if (q > 0.0) kl += q * (std::log(q) - log_sigmoid(m));
  if (q < 1.0) kl += (1.0 - q) * (std::log1p(-q) - log_sigmoid(-m));
  return kl;
}

}  // namespace

AnswerSensitivity::AnswerSensitivity(arch::DecoderModel& model, AnswerReference& reference,
                                     std::vector<int64_t> ladder, int64_t sink_tokens)
    : model_(model), reference_(reference), ladder_(std::move(ladder)), sink_tokens_(sink_tokens) {
  HEADWISE_CHECK(!ladder_.empty(), "answer-grad: empty ladder");
}

void AnswerSensitivity::prepare(int64_t layer, ActivationStream& stream,
                                const std::vector<int64_t>& at_windows) {
  const auto& spec = model_.spec().layer(layer);
  HEADWISE_CHECK(spec.is_global(), "answer-grad: layer {} is not a global attention layer", layer);
  // A new layer or a new stream (prepare at full KV starts each): the single-window outputs change.
  if (at_windows.empty()) levels_cache_.clear();
  levels_cache_.use_layer(layer);
  layer_ = layer;
  heads_ = static_cast<size_t>(spec.attention->num_kv_heads);
  at_windows_ = at_windows.empty() ? std::vector<int64_t>(heads_, kFullWindow) : at_windows;
  HEADWISE_CHECK(at_windows_.size() == heads_, "answer-grad: {} linearisation windows for {} heads",
                 at_windows_.size(), heads_);
  levels_ = ladder_.size();
  answers_.clear();
  backward_passes_ = 0;
  const auto start = std::chrono::steady_clock::now();
  int64_t m = 0;
  stream.visit([&](const at::Tensor& entering) { accumulate(m++, entering); });
  gather_answers_of_every_rank();
  spdlog::debug(
      "answer-grad layer {} at [{}]: {} answers, {} backward passes through the layers above, "
      "{:.2f}s",
      layer, fmt::join(at_windows_, ","), answers_.size(), backward_passes_,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

AnswerSensitivity::Slots AnswerSensitivity::answer_slots(int64_t micro_batch,
                                                         const at::Tensor& final_hidden,
                                                         bool separable) {
  const DifferentiableScope scope;
  const at::Tensor top = gradient_leaf(final_hidden);
  const at::Tensor log_p = reference_.output_log_probs(micro_batch, top);  // [answers, vocab]
  const at::Tensor& ref = reference_.reference(micro_batch);
  const at::Tensor answer = ref.argmax(-1, /*keepdim=*/true);
  const at::Tensor log_p_answer = log_p.gather(1, answer).squeeze(1).to(at::kDouble);
  // log-odds M = log p - log(1 - p); expm1 keeps 1 - p exact when p is near 1.
  const at::Tensor log_odds = log_p_answer - at::log(-at::expm1(log_p_answer).clamp_max(-1e-300));

  Slots slots;
  slots.row = to_vector(reference_.answer_rows(micro_batch));
  slots.position = to_vector(reference_.answer_columns(micro_batch));
  std::map<int64_t, int64_t> seen;  // answers so far per row
  int64_t count = 1;
  for (int64_t r : slots.row) {
    slots.slot.push_back(separable ? 0 : seen[r]++);
    count = std::max(count, slots.slot.back() + 1);
  }
  const std::vector<double> m = [&] {
    const at::Tensor cpu = log_odds.detach().cpu().contiguous();
    return std::vector<double>(cpu.data_ptr<double>(), cpu.data_ptr<double>() + cpu.numel());
  }();
  const at::Tensor q = ref.gather(1, answer).squeeze(1).exp().to(at::kDouble).cpu().contiguous();
  for (size_t a = 0; a < m.size(); ++a) {
    answers_.push_back({m[a], q.data_ptr<double>()[a], std::vector<double>(heads_ * levels_, 0.0)});
  }
  const at::Tensor slot_of = at::tensor(slots.slot, at::kLong).to(log_odds.device());
  for (int64_t j = 0; j < count; ++j) {
    const at::Tensor loss =
        thread_count_independent_sum(at::where(slot_of == j, log_odds, at::zeros_like(log_odds)));
    slots.cotangents.push_back(torch::autograd::grad({loss}, {top}, {}, j + 1 < count)[0]);
  }
  return slots;
}

void AnswerSensitivity::accumulate(int64_t micro_batch, const at::Tensor& entering) {
  const int64_t num_layers = model_.spec().num_layers();
  const auto level = [this, micro_batch](const arch::AttentionInputs& in, int64_t window) {
    if (const at::Tensor* cached = levels_cache_.find(micro_batch, window)) return *cached;
    const int64_t chunk = model_.attention_chunk();
    // Every level in one pass over the keys (measure/multiwindow.hpp) when they fit the cache.
    const auto one = static_cast<int64_t>(in.q.numel() * static_cast<int64_t>(sizeof(float)));
    const bool in_ladder = std::find(ladder_.begin(), ladder_.end(), window) != ladder_.end();
    if (in_ladder && levels_cache_.fits(one * static_cast<int64_t>(ladder_.size()))) {
      const at::Tensor all =
          measure::all_window_outputs(in, measure::WindowLadder{ladder_}, sink_tokens_, chunk);
      for (size_t l = 0; l < ladder_.size(); ++l) {
        levels_cache_.keep(micro_batch, ladder_[l], all[static_cast<int64_t>(l)]);
      }
      return *levels_cache_.find(micro_batch, window);
    }
    return levels_cache_.keep(
        micro_batch, window,
        arch::windowed_attention(in, window, sink_tokens_, chunk).to(at::kFloat));
  };
  LeafCore core(layer_, ladder_, at_windows_, level, model_.attention_chunk());
  at::Tensor out;
  {
    const DifferentiableScope scope;
    out = model_.run_layer(layer_, entering, {&core, nullptr, 0});
  }
  // The layers above once without a graph, keeping what enters each (activation checkpointing).
  arch::ExactAttentionCore exact(model_.attention_chunk());
  std::vector<at::Tensor> inputs;
  at::Tensor hidden = out.detach();
  for (int64_t i = layer_ + 1; i < num_layers; ++i) {
    inputs.push_back(hidden);
    model_.prefetch_layer(i + 1);
    hidden = model_.run_layer(i, hidden, {&exact, nullptr, 0});
    if (i + 1 < num_layers) model_.release_layer(i);  // the top one is needed again at once
  }
  // Above the last layer nothing mixes positions: one backward serves every answer.
  const bool separable = layer_ == num_layers - 1;
  const size_t first_answer = answers_.size();
  Slots slots = answer_slots(micro_batch, hidden, separable);
  std::vector<at::Tensor>& cotangents = slots.cotangents;
  // Back down: each layer recomputed with its graph once, every slot's cotangent pulled through it.
  for (int64_t i = num_layers - 1; i > layer_; --i) {
    const DifferentiableScope scope;
    const at::Tensor x = gradient_leaf(inputs[static_cast<size_t>(i - layer_ - 1)]);
    cotangents = pull_back(model_.run_layer(i, x, {&exact, nullptr, 0}), x, cotangents);
    backward_passes_ += static_cast<int64_t>(cotangents.size());
    model_.release_layer(i);
  }
  std::vector<at::Tensor> at_output;
  {
    const DifferentiableScope scope;
    at_output = pull_back(out, core.leaf(), cotangents);
  }

  const int64_t batch = entering.size(0), steps = entering.size(1);
  const auto kv = static_cast<int64_t>(heads_);
  for (size_t level = 0; level < levels_; ++level) {
    const at::Tensor& delta = core.delta(level);
    if (!delta.defined()) continue;  // full KV: no change
    for (size_t j = 0; j < at_output.size(); ++j) {
      // Per KV head: its GQA group of query heads is contiguous in o.
      const at::Tensor products = (at_output[j].to(at::kFloat) * delta)
                                      .to(at::kDouble)
                                      .reshape({batch, steps, kv, -1})
                                      .sum(3);
      // separable: each answer's shift is its own position's term; else the slot's whole sum.
      const at::Tensor per =
          separable ? products.cpu().contiguous() : products.sum(1).cpu().contiguous();
      const double* d = per.data_ptr<double>();
      for (size_t a = 0; a < slots.slot.size(); ++a) {
        if (slots.slot[a] != static_cast<int64_t>(j)) continue;
        const int64_t r = slots.row[a];
        const double* at_answer = separable ? d + (r * steps + slots.position[a]) * kv : d + r * kv;
        auto& shift = answers_[first_answer + a].shift;
        for (size_t h = 0; h < heads_; ++h) shift[h * levels_ + level] = at_answer[h];
      }
    }
  }
}

// Each rank linearised its shard's answers; predict() needs all of them. Their order does not
// matter: predict() sums exactly.
void AnswerSensitivity::gather_answers_of_every_rank() {
  dist::Collective& world = reference_.world();
  if (world.world_size() == 1) return;
  const size_t doubles = 2 + heads_ * levels_;
  std::string local;
  local.reserve(answers_.size() * doubles * sizeof(double));
  const auto put = [&local](double v) {
    local.append(reinterpret_cast<const char*>(&v), sizeof v);
  };
  for (const Answer& a : answers_) {
    put(a.log_odds);
    put(a.reference);
    for (double s : a.shift) put(s);
  }
  answers_.clear();
  const auto all =
      world.all_gather(local, fmt::format("layer {}: answer-grad linearisation", layer_));
  for (const std::string& bytes : all) {
    HEADWISE_CHECK(bytes.size() % (doubles * sizeof(double)) == 0,
                   "answer-grad: {} bytes from a rank", bytes.size());
    std::vector<double> v(bytes.size() / sizeof(double));
    std::memcpy(v.data(), bytes.data(), bytes.size());
    for (size_t at = 0; at < v.size(); at += doubles) {
      answers_.push_back(
          {v[at], v[at + 1],
           std::vector<double>(v.begin() + static_cast<std::ptrdiff_t>(at + 2),
                               v.begin() + static_cast<std::ptrdiff_t>(at + doubles))});
    }
  }
}

double AnswerSensitivity::predict(const std::vector<size_t>& levels) const {
  HEADWISE_CHECK(layer_ >= 0 && levels.size() == heads_,
                 "answer-grad: predict for {} heads, prepared {}", levels.size(), heads_);
  ExactSum total;
  for (const Answer& a : answers_) {
    double shift = 0.0, shift_top = 0.0;
    for (size_t h = 0; h < heads_; ++h) {
      shift += a.shift[h * levels_ + levels[h]];
      shift_top += a.shift[h * levels_ + levels_ - 1];
    }
    total.add(two_class_kl(a.reference, a.log_odds + shift) -
              two_class_kl(a.reference, a.log_odds + shift_top));
  }
  return std::max(0.0, total.value()) / static_cast<double>(reference_.answer_count());
}

namespace {

std::vector<double> average_ranks(const std::vector<double>& values) {
  std::vector<size_t> order(values.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return values[a] < values[b]; });
  std::vector<double> ranks(values.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && values[order[j + 1]] == values[order[i]]) ++j;
    const double rank = 0.5 * static_cast<double>(i + j) + 1.0;
    for (size_t k = i; k <= j; ++k) ranks[order[k]] = rank;
    i = j + 1;
  }
  return ranks;
}

}  // namespace

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size() || a.size() < 2) return std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> ra = average_ranks(a), rb = average_ranks(b);
  const double mean = 0.5 * static_cast<double>(a.size() + 1);
  double cov = 0.0, va = 0.0, vb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    cov += (ra[i] - mean) * (rb[i] - mean);
    va += (ra[i] - mean) * (ra[i] - mean);
    vb += (rb[i] - mean) * (rb[i] - mean);
  }
  if (va == 0.0 || vb == 0.0) return std::numeric_limits<double>::quiet_NaN();
  return cov / std::sqrt(va * vb);
}

}  // namespace headwise::calib
