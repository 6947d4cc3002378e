// The answer-span measure: evaluations of candidates and policies on the span, and the sweep
// that runs many sites' candidates through the layers above at once. See answer_span.hpp.
#include "headwise/calib/answer_span.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "calib/data/answer_positions.hpp"
#include "calib/measures/answer_span_parts.hpp"
#include "calib/measures/span_attention.hpp"
#include "calib/walk/finite_checks.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/exact_sum.hpp"
#include "headwise/core/units.hpp"

namespace headwise::calib {

using namespace answer_span_parts;

std::vector<double> AnswerSpan::evaluate(const SpanSite& site,
                                         const std::vector<SpanOutputs>& candidates,
                                         const std::string& what,
                                         std::vector<SequenceValues>* per_sequence) {
  if (per_sequence == nullptr) return sweep({{&site, candidates}}, what).front();
  std::vector<std::vector<SequenceValues>> values;
  std::vector<double> means = sweep({{&site, candidates}}, what, &values).front();
  *per_sequence = std::move(values.front());
  return means;
}

// Every batch whose site lies below layer j runs layer j against the same cache whatever its
// layer or candidates: the batches of one micro-batch run as one call (their candidates side by
// side, b-major), up to kRowsPerCall span rows, so the calls per layer do not grow with the number
// of sites below it.
void AnswerSpan::run_above_sites(int64_t j, std::vector<SpanBatch>& batches,
                                 const std::vector<SweepItem>& items) {
  const auto micro_batches = micro_batch_rows_.size();
  for (size_t m = 0; m < micro_batches; ++m) {
    const int64_t rows = micro_batch_rows_[m];
    const int64_t max_count =
        std::max<int64_t>(1, kRowsPerCall / std::max<int64_t>(1, rows * span_length_));
    std::vector<SpanBatch*> group;
    int64_t count = 0;
    auto flush = [&] {
      if (group.empty()) return;
      std::vector<at::Tensor> parts;
      for (SpanBatch* b : group)
        parts.push_back(b->hidden.view({rows, -1, b->hidden.size(1), b->hidden.size(2)}));
      const at::Tensor merged = at::cat(parts, 1).view({rows * count, span_length_, -1});
      const LayerCache& cache = caches_[static_cast<size_t>(j)][m];
      CachedSpanCore core(cache.keys);
      arch::LayerState state = repeated(cache.state, count);
      const at::Tensor out =
          model_.run_layer(j, merged, {&core, state.empty() ? nullptr : &state, span_begin_})
              .view({rows, count, span_length_, -1});
      int64_t c0 = 0;
      for (SpanBatch* b : group) {
        const auto c = static_cast<int64_t>(b->c1 - b->c0);
        b->hidden = out.narrow(1, c0, c).reshape({rows * c, span_length_, -1});
        c0 += c;
      }
      candidate_layer_passes_ += count;
      group.clear();
      count = 0;
    };
    for (SpanBatch& b : batches) {
      const SweepItem& item = items[b.item];
      if (b.micro_batch != m || item.site->layer >= j) continue;
      const bool under_windows = item.above != nullptr && item.above->contains(j);
      if (under_windows || b.rows != rows) {
        run_alone(j, b, under_windows ? &item.above->at(j) : nullptr);
        continue;
      }
      const auto c = static_cast<int64_t>(b.c1 - b.c0);
      if (count + c > max_count) flush();
      group.push_back(&b);
      count += c;
    }
    flush();
  }
}

namespace {

// The first `rows` sequences of a micro-batch's cache.
KeyBlock first_rows(const KeyBlock& keys, int64_t rows) {
  if (!keys.k.defined() || keys.k.size(0) == rows) return keys;
  return {keys.k.narrow(0, 0, rows), keys.v.narrow(0, 0, rows), keys.first_position};
}

arch::LayerState first_rows(const arch::LayerState& state, int64_t rows) {
  arch::LayerState out;
  for (const auto& [name, t] : state) out[name] = t.narrow(0, 0, rows);
  return out;
}

}  // namespace

void AnswerSpan::run_alone(int64_t j, SpanBatch& batch, const std::vector<int64_t>* windows) {
  const int64_t count = static_cast<int64_t>(batch.c1 - batch.c0);
  const LayerCache& cache = caches_[static_cast<size_t>(j)][batch.micro_batch];
  const KeyBlock keys = first_rows(cache.keys, batch.rows);
  std::optional<WindowedCachedSpanCore> windowed;
  std::optional<CachedSpanCore> plain;
  arch::AttentionCore* core = nullptr;
  if (windows != nullptr) {
    core = &windowed.emplace(keys, *windows, options_.sink_tokens);
  } else {
    core = &plain.emplace(keys);
  }
  arch::LayerState state = repeated(first_rows(cache.state, batch.rows), count);
  batch.hidden =
      model_.run_layer(j, batch.hidden, {core, state.empty() ? nullptr : &state, span_begin_});
  candidate_layer_passes_ += count;
}

std::vector<double> AnswerSpan::evaluate_policies(
    int64_t layer, ActivationStream& stream,
    const std::vector<std::map<int64_t, std::vector<int64_t>>>& policies, const std::string& what) {
  HEADWISE_CHECK(!policies.empty(), "answer span: {}: no policy to evaluate", what);
  const SpanSite site = capture(layer, stream);
  std::vector<SweepItem> items;
  for (const auto& policy : policies) {
    const auto windows = policy.find(layer);
    HEADWISE_CHECK(windows != policy.end(), "answer span: {}: a policy without layer {}", what,
                   layer);
    items.push_back({&site, {site.compose(windows->second)}, &policy});
  }
  std::vector<double> values;
  for (const auto& per_item : sweep(items, what)) values.push_back(per_item.front());
  return values;
}

std::vector<std::vector<double>> AnswerSpan::sweep(
    const std::vector<SweepItem>& items, const std::string& what,
    std::vector<std::vector<SequenceValues>>* per_sequence) {
  const auto& spec = model_.spec();
  const auto micro_batches = micro_batch_rows_.size();
  std::vector<SpanBatch> batches;
  int64_t lowest = spec.num_layers();
  for (size_t i = 0; i < items.size(); ++i) {
    const SweepItem& item = items[i];
    HEADWISE_CHECK(item.site != nullptr && item.site->input.size() == micro_batches,
                   "answer span: site without inputs");
    lowest = std::min(lowest, item.site->layer);
    int64_t first_row = 0;  // of micro-batch m among this rank's sequences
    for (size_t m = 0; m < micro_batches; ++m) {
      const int64_t all_rows = micro_batch_rows_[m];
      const int64_t used = item.sequences < 0
                               ? all_rows
                               : std::clamp<int64_t>(item.sequences - first_row, 0, all_rows);
      first_row += all_rows;
      if (used == 0) continue;
      const auto per_call = static_cast<size_t>(
          std::max<int64_t>(1, kRowsPerCall / std::max<int64_t>(1, used * span_length_)));
      for (size_t c0 = 0; c0 < item.candidates.size(); c0 += per_call) {
        batches.push_back({i, m, c0, std::min(item.candidates.size(), c0 + per_call), {}, used});
      }
    }
  }
  for (int64_t j = lowest; j < spec.num_layers(); ++j) {
    model_.prefetch_layer(j + 1);
    for (SpanBatch& b : batches) {
      const SweepItem& item = items[b.item];
      const auto count = static_cast<int64_t>(b.c1 - b.c0);
      if (item.site->layer == j) {
        std::vector<at::Tensor> outputs;
        for (size_t c = b.c0; c < b.c1; ++c) {
          HEADWISE_CHECK(item.candidates[c].size() == micro_batches,
                         "answer span: candidate without every micro-batch");
          outputs.push_back(item.candidates[c][b.micro_batch].narrow(0, 0, b.rows));
        }
        std::vector<const at::Tensor*> pointers;
        for (const at::Tensor& t : outputs) pointers.push_back(&t);
        InjectedCore core(interleave_candidates(pointers));
        arch::LayerState state =
            b.micro_batch < item.site->state.size()
                ? repeated(first_rows(item.site->state[b.micro_batch], b.rows), count)
                : arch::LayerState{};
        const at::Tensor input =
            item.site->input[b.micro_batch].narrow(0, 0, b.rows).repeat_interleave(count, 0);
        b.hidden =
            model_.run_layer(j, input, {&core, state.empty() ? nullptr : &state, span_begin_});
        candidate_layer_passes_ += count;
      }
    }
    run_above_sites(j, batches, items);
    // The measured (lowest) layer stays resident when it may: the walk runs it under its decision
    // next.
    if (j > lowest || !options_.keep_measured_layer) model_.release_layer(j);
  }
  std::vector<std::vector<ExactSum>> sums(items.size());
  std::vector<int64_t> answers_used(items.size(), 0);
  for (size_t i = 0; i < items.size(); ++i) sums[i].resize(items[i].candidates.size());
  // Per sequence (issue 59): beside the pooled sums, which they do not change.
  std::vector<int64_t> first_row_of(micro_batches, 0);
  for (size_t m = 1; m < micro_batches; ++m)
    first_row_of[m] = first_row_of[m - 1] + micro_batch_rows_[m - 1];
  const auto local_sequences =
      static_cast<size_t>(micro_batches == 0 ? 0 : first_row_of.back() + micro_batch_rows_.back());
  std::vector<std::vector<std::vector<ExactSum>>> sequence_sums;
  std::vector<std::vector<int64_t>> sequence_answers;
  if (per_sequence != nullptr) {
    sequence_sums.resize(items.size());
    sequence_answers.assign(items.size(), std::vector<int64_t>(local_sequences, 0));
    for (size_t i = 0; i < items.size(); ++i)
      sequence_sums[i].assign(items[i].candidates.size(), std::vector<ExactSum>(local_sequences));
  }
  for (const SpanBatch& b : batches) {
    const auto count = static_cast<int64_t>(b.c1 - b.c0);
    const auto m = static_cast<size_t>(b.micro_batch);
    // The answers of the rows the batch measured (every one unless SweepItem::sequences).
    const bool every_row = b.rows == micro_batch_rows_[m];
    const at::Tensor kept = every_row ? at::Tensor() : answer_rows_[m] < b.rows;
    const at::Tensor answer_rows = every_row ? answer_rows_[m] : answer_rows_[m].index({kept});
    const at::Tensor answer_columns =
        every_row ? answer_columns_[m] : answer_columns_[m].index({kept});
    if (b.c0 == 0) answers_used[b.item] += answer_rows.size(0);
    if (answer_rows.size(0) == 0) continue;
    // Answer a of sequence r is row r * C + c of the batch.
    const at::Tensor rows =
        answer_rows.unsqueeze(1) * count + at::arange(count, answer_rows.options()).unsqueeze(0);
    const at::Tensor cols = (answer_columns - span_begin_).unsqueeze(1).expand_as(rows);
    const at::Tensor picked = b.hidden.index({rows.reshape(-1), cols.reshape(-1)}).unsqueeze(0);
    const at::Tensor log_q =
        at::log_softmax(model_.logits(picked).squeeze(0).to(at::kFloat), -1);  // [answers * C, V]
    const at::Tensor reference = every_row ? reference_[m] : reference_[m].index({kept});
    const at::Tensor log_p = reference.repeat_interleave(count, 0);
    const at::Tensor per = divergence_per_position(log_p, log_q, options_.divergence)
                               .to(at::kDouble)
                               .view({-1, count})
                               .cpu()
                               .contiguous();  // [answers, C]
    const double* d = per.data_ptr<double>();
    const int64_t n = per.size(0);
    for (int64_t c = 0; c < count; ++c) {
      ExactSum& sum = sums[b.item][b.c0 + static_cast<size_t>(c)];
      for (int64_t a = 0; a < n; ++a) sum.add(d[a * count + c]);
    }
    if (per_sequence != nullptr) {
      const at::Tensor local_rows = answer_rows.to(at::kCPU, at::kLong).contiguous();
      const int64_t* r = local_rows.data_ptr<int64_t>();
      for (int64_t a = 0; a < n; ++a) {
        const auto s = static_cast<size_t>(first_row_of[m] + r[a]);
        if (b.c0 == 0) ++sequence_answers[b.item][s];
        for (int64_t c = 0; c < count; ++c)
          sequence_sums[b.item][b.c0 + static_cast<size_t>(c)][s].add(d[a * count + c]);
      }
    }
  }
  std::vector<std::vector<double>> means(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    evaluations_ += static_cast<int64_t>(items[i].candidates.size());
    const auto merged = dist::sum_all(*world_, std::move(sums[i]), what);
    const int64_t answers = items[i].sequences < 0
                                ? answers_
                                : dist::sum_all(*world_, answers_used[i], what + ": answers");
    if (answers == 0) {
      throw_input_error("{}: the first {} calibration sequences have no answer positions", what,
                        items[i].sequences);
    }
    for (size_t c = 0; c < merged.size(); ++c) {
      const double mean = merged[c].value() / static_cast<double>(answers);
      if (!std::isfinite(mean)) {
        throw NumericError(
            fmt::format("{}: {} is NaN/Inf for candidate {} of layer {}: check the layer's weights",
                        what, divergence_label(options_.divergence), c, items[i].site->layer));
      }
      means[i].push_back(mean);
    }
  }
  if (per_sequence != nullptr) {
    per_sequence->assign(items.size(), {});
    for (size_t i = 0; i < items.size(); ++i) {
      for (const auto& by_sequence : sequence_sums[i]) {
        SequenceValues values;
        values.answers = sequence_answers[i];
        for (const ExactSum& sum : by_sequence) values.sums.push_back(sum.value());
        (*per_sequence)[i].push_back(std::move(values));
      }
    }
  }
  return means;
}

double AnswerSpan::evaluate_final(ActivationStream& final_hidden) {
  ExactSum total;
  int64_t m = 0;
  final_hidden.visit([&](const at::Tensor& hidden) {
    const at::Tensor log_q = log_probs_at_answers(m, hidden, 0);
    total.add(
        divergence_per_position(reference_[static_cast<size_t>(m)], log_q, options_.divergence)
            .to(at::kDouble)
            .sum()
            .item<double>());
    ++m;
  });
  return dist::sum_all(*world_, total, "the walk's end-to-end answer divergence").value() /
         static_cast<double>(answers_);
}

}  // namespace headwise::calib
