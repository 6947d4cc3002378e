// The answer-span measure (calib/answer_span.hpp) against independent computations: its attention
// against windowed attention over the same keys, and on every family's fixture its divergence
// against a plain forward in which the measured layer's windows apply to the span's queries only
// (what the measure computes, by construction), and, with the whole sequence as the span, against
// the exact measure.
#include <catch2/catch.hpp>

#include <c10/core/InferenceMode.h>

#include <map>
#include <random>

#include "../arch/fixture_reference.hpp"
#include "calib/measures/span_attention.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/arch/visible_keys.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/answer_reference.hpp"
#include "headwise/calib/answer_span.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/io/checkpoint.hpp"

using namespace headwise;

namespace {

// Random attention inputs [B, heads, T, hd] with `kv` KV heads.
arch::AttentionInputs random_inputs(int64_t batch, int64_t heads, int64_t kv, int64_t steps,
                                    int64_t head_dim, uint64_t seed) {
  at::manual_seed(static_cast<int64_t>(seed));
  arch::AttentionInputs in;
  in.q = at::randn({batch, heads, steps, head_dim});
  in.k = at::randn({batch, kv, steps, head_dim});
  in.v = at::randn({batch, kv, steps, head_dim});
  in.scaling = 1.0 / std::sqrt(static_cast<double>(head_dim));
  return in;
}

// A family's test fixture, attention in chunks of 16 queries (several chunks per sequence).
std::unique_ptr<arch::DecoderModel> fixture_model(const char* name) {
  arch::ModelOptions options;
  options.attention_chunk = 16;
  return arch::load_model(testing::fixture_dir(name), options);
}

// windowed_attention's rows [begin, T) of one sequence's inputs.
at::Tensor reference_rows(const arch::AttentionInputs& in, int64_t window, int64_t sinks,
                          int64_t begin) {
  const std::vector<int64_t> windows(static_cast<size_t>(in.k.size(1)), window);
  return arch::windowed_attention(in, windows, sinks, 7).slice(1, begin, in.q.size(2));
}

std::vector<std::vector<int64_t>> random_sequences(int64_t count, int64_t steps, int64_t vocab,
                                                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> token(0, vocab - 1);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(count),
                                        std::vector<int64_t>(static_cast<size_t>(steps)));
  for (auto& s : out) {
    for (auto& t : s) t = token(rng);
  }
  return out;
}

// Global layer `layer` keeps `windows` for queries at positions >= `from` and full KV before;
// every other layer runs exactly (sliding where it slides).
class SpanOnlyWindowsCore final : public arch::AttentionCore {
 public:
  SpanOnlyWindowsCore(int64_t layer, std::vector<int64_t> windows, int64_t from, int64_t sinks)
      : layer_(layer), windows_(std::move(windows)), from_(from), sinks_(sinks) {}
  at::Tensor attend(const arch::AttentionInputs& in) override {
    arch::ExactAttentionCore exact(16);
    at::Tensor full = exact.attend(in);
    if (in.layer_id != layer_) return full;
    const at::Tensor windowed = arch::windowed_attention(in, windows_, sinks_, 16);
    full.slice(1, from_, full.size(1)).copy_(windowed.slice(1, from_, windowed.size(1)));
    return full;
  }

 private:
  int64_t layer_;
  std::vector<int64_t> windows_;
  int64_t from_;
  int64_t sinks_;
};

// Mean TV at the answer positions between the plain forward and the forward through `core`.
double forward_divergence(arch::DecoderModel& model, const std::vector<std::vector<int64_t>>& seqs,
                          const std::vector<std::vector<int64_t>>& answers,
                          arch::AttentionCore& core) {
  const at::Tensor ids = calib::token_batch(seqs, 0, seqs.size());
  arch::ExactAttentionCore exact(16);
  const at::Tensor ref = at::log_softmax(model.logits(model.hidden_states(ids, exact)), -1);
  const at::Tensor run = at::log_softmax(model.logits(model.hidden_states(ids, core)), -1);
  double total = 0.0;
  int64_t count = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int64_t t : answers[s]) {
      const auto i = static_cast<int64_t>(s);
      total += calib::divergence_per_position(ref[i][t].unsqueeze(0), run[i][t].unsqueeze(0),
                                              calib::AnswerDivergence::kTv)
                   .item<double>();
      ++count;
    }
  }
  return total / static_cast<double>(count);
}

}  // namespace

TEST_CASE(
    "span attention equals windowed attention over the same keys, for several candidates at once",
    "[calib]") {
  c10::InferenceMode inference;
  const int64_t batch = 2, heads = 4, kv = 2, steps = 40, hd = 8, begin = 29, candidates = 3;
  for (const auto& [window, sinks] :
       std::vector<std::pair<int64_t, int64_t>>{{kFullWindow, 0}, {5, 0}, {6, 2}, {13, 3}}) {
    // Candidate c's span keys differ (own inputs per candidate); the prefix is shared.
    std::vector<arch::AttentionInputs> runs;
    for (int64_t c = 0; c < candidates; ++c)
      runs.push_back(random_inputs(batch, heads, kv, steps, hd, 11 + static_cast<uint64_t>(c)));
    for (auto& r : runs) {
      r.k.slice(2, 0, begin).copy_(runs[0].k.slice(2, 0, begin));
      r.v.slice(2, 0, begin).copy_(runs[0].v.slice(2, 0, begin));
    }
    std::vector<at::Tensor> q, k, v;
    for (const auto& r : runs) {
      q.push_back(r.q.slice(2, begin, steps));
      k.push_back(r.k.slice(2, begin, steps));
      v.push_back(r.v.slice(2, begin, steps));
    }
    // b-major rows: sequence b's candidates together.
    const auto interleave = [&](const std::vector<at::Tensor>& parts) {
      const at::Tensor s = at::stack(parts, 1);
      return s.reshape({batch * candidates, s.size(2), s.size(3), s.size(4)});
    };
    const calib::KeyBlock shared{runs[0].k.slice(2, 0, begin), runs[0].v.slice(2, 0, begin), 0};
    const calib::KeyBlock own{interleave(k), interleave(v), begin};
    calib::SpanAttentionShape shape;
    shape.scaling = runs[0].scaling;
    shape.window = window;
    shape.sink_tokens = sinks;
    const at::Tensor out =
        calib::span_attention(interleave(q), begin, shared, &own, shape);  // [B*C, S, heads, hd]
    for (int64_t c = 0; c < candidates; ++c) {
      const at::Tensor expected =
          reference_rows(runs[static_cast<size_t>(c)], window, sinks, begin);
      for (int64_t b = 0; b < batch; ++b) {
        CHECK(testing::max_abs_diff(out[b * candidates + c], expected[b]) < 1e-5);
      }
    }
    // The measured layer's form: every key shared, none of its own.
    const calib::KeyBlock all{runs[1].k, runs[1].v, 0};
    const at::Tensor whole =
        calib::span_attention(runs[1].q.slice(2, begin, steps), begin, all, nullptr, shape);
    CHECK(testing::max_abs_diff(whole, reference_rows(runs[1], window, sinks, begin)) < 1e-5);
  }
  // Soft-capping and gpt-oss sink logits join the same softmax.
  auto in = random_inputs(1, 4, 2, 24, 8, 5);
  in.logit_softcap = 3.0;
  in.sink_logits = at::randn({4});
  calib::SpanAttentionShape shape;
  shape.scaling = in.scaling;
  shape.logit_softcap = 3.0;
  shape.sink_logits = in.sink_logits;
  shape.window = 9;
  const calib::KeyBlock shared{in.k.slice(2, 0, 20), in.v.slice(2, 0, 20), 0};
  const calib::KeyBlock own{in.k.slice(2, 20, 24), in.v.slice(2, 20, 24), 20};
  CHECK(testing::max_abs_diff(calib::span_attention(in.q.slice(2, 20, 24), 20, shared, &own, shape),
                              reference_rows(in, 9, 0, 20)) < 1e-5);
}

TEST_CASE(
    "answer span: on every family, a candidate's divergence is the forward's with its windows on "
    "the span only",
    "[calib]") {
  c10::InferenceMode inference;
  for (const char* name :
       {"qwen3_next_tiny", "gemma3_gqa4", "gpt_oss_tiny", "falcon_h1_tiny", "bamba_tiny",
        "jamba_tiny", "nemotron_h_tiny", "lfm2_tiny", "qwen3_sliding"}) {
    INFO(name);
    auto model = fixture_model(name);
    const auto& spec = model->spec();
    const int64_t steps = 48;
    const auto seqs = random_sequences(3, steps, spec.vocab_size, 7);
    const std::vector<std::vector<int64_t>> answers(seqs.size(), {36, 40, 44, 46});
    calib::AnswerSpanOptions so;
    so.micro_batch = 2;  // two micro-batches: 2 + 1 sequences
    so.windows = {4, 8, kFullWindow};
    so.sink_tokens = 1;
    so.margin = 6;  // the span starts at 30
    calib::AnswerSpan span(*model, seqs, answers, so);
    REQUIRE(span.span_begin() == 30);
    for (int64_t layer : spec.global_layer_ids()) {
      INFO("layer " << layer);
      const auto heads = static_cast<size_t>(spec.layer(layer).attention->num_kv_heads);
      const calib::SpanSite& site = span.reference_site(layer);
      std::vector<std::vector<int64_t>> assignments{std::vector<int64_t>(heads, kFullWindow),
                                                    std::vector<int64_t>(heads, 4)};
      std::vector<int64_t> mixed(heads, kFullWindow);
      mixed[0] = 8;
      assignments.push_back(mixed);
      std::vector<calib::SpanOutputs> candidates;
      for (const auto& w : assignments) candidates.push_back(site.compose(w));
      const auto measured = span.evaluate(site, candidates, "test");
      CHECK(measured[0] < 1e-6);  // full KV reproduces the reference
      for (size_t c = 0; c < assignments.size(); ++c) {
        SpanOnlyWindowsCore core(layer, assignments[c], span.span_begin(), 1);
        CHECK(measured[c] == Approx(forward_divergence(*model, seqs, answers, core)).margin(2e-5));
      }
      // A site captured on the full-KV stream is the reference one.
      calib::ActivationStream stream(*model, seqs, 2, calib::ActivationPlacement::kAuto);
      arch::ExactAttentionCore exact(16);
      for (int64_t i = 0; i < layer; ++i)
        stream.apply([&](const at::Tensor& h) {
          return model->run_layer(i, h, {&exact, nullptr, 0});
        });
      const calib::SpanSite captured = span.capture(layer, stream);
      const auto again = span.evaluate(captured, {captured.compose(assignments[1])}, "test");
      CHECK(again[0] == Approx(measured[1]).margin(1e-6));
    }
  }
}

TEST_CASE(
    "answer span: a sweep that may not keep its measured layer releases it and measures the same",
    "[calib]") {
  // When two layers' weights do not fit (the memory plan), the measured layer goes with the
  // others; the walk loads it again to run it under its decision.
  c10::InferenceMode inference;
  auto model = fixture_model("qwen3_next_tiny");
  const auto& spec = model->spec();
  const auto seqs = random_sequences(2, 40, spec.vocab_size, 5);
  const std::vector<std::vector<int64_t>> answers(seqs.size(), {33, 37, 39});
  std::map<bool, std::vector<std::vector<double>>> measured;
  for (const bool keep : {true, false}) {
    calib::AnswerSpanOptions so;
    so.windows = {4, 8, kFullWindow};
    so.margin = 5;
    so.keep_measured_layer = keep;
    calib::AnswerSpan span(*model, seqs, answers, so);
    for (int64_t layer : spec.global_layer_ids()) {
      INFO("keep " << keep << ", layer " << layer);
      const auto heads = static_cast<size_t>(spec.layer(layer).attention->num_kv_heads);
      const calib::SpanSite& site = span.reference_site(layer);
      std::vector<int64_t> mixed(heads, kFullWindow);
      mixed[0] = 8;
      model->release_all();
      measured[keep].push_back(span.evaluate(
          site, {site.compose(std::vector<int64_t>(heads, 4)), site.compose(mixed)}, "test"));
      const int64_t resident = model->resident_weight_bytes();
      // What the logits read (final norm, head) stays; no layer does unless kept.
      model->release_all();
      model->logits(at::zeros({1, 1, spec.hidden_size}));
      const int64_t outer = model->resident_weight_bytes();
      if (keep) {
        CHECK(resident > outer);
      } else {
        CHECK(resident == outer);
      }
    }
  }
  CHECK(measured[true] == measured[false]);
}

TEST_CASE(
    "answer span: with the whole sequence as the span it is the exact measure; a sweep equals one "
    "call per layer",
    "[calib]") {
  c10::InferenceMode inference;
  for (const char* name : {"qwen3_next_tiny", "gemma3_gqa4", "falcon_h1_tiny"}) {
    INFO(name);
    auto model = fixture_model(name);
    const auto& spec = model->spec();
    const auto seqs = random_sequences(2, 40, spec.vocab_size, 3);
    const std::vector<std::vector<int64_t>> answers(seqs.size(), {30, 35, 38});
    calib::AnswerSpanOptions so;
    so.micro_batch = 2;
    so.windows = {4, 16, kFullWindow};
    so.margin = 100;  // span = every position
    calib::AnswerSpan span(*model, seqs, answers, so);
    REQUIRE(span.span_begin() == 0);
    calib::AnswerReference exact(*model, seqs, answers, 2, 0, dist::single_process(),
                                 calib::AnswerDivergence::kTv);
    std::vector<calib::AnswerSpan::SweepItem> items;
    std::vector<std::vector<std::vector<int64_t>>> assignments;
    for (int64_t layer : spec.global_layer_ids()) {
      const auto heads = static_cast<size_t>(spec.layer(layer).attention->num_kv_heads);
      std::vector<int64_t> cut(heads, kFullWindow);
      if (!cut.empty()) cut.back() = 4;
      assignments.push_back({std::vector<int64_t>(heads, 16), cut});
      items.push_back({&span.reference_site(layer), {}});
      for (const auto& w : assignments.back())
        items.back().candidates.push_back(span.reference_site(layer).compose(w));
    }
    const auto swept = span.sweep(items, "test");
    size_t i = 0;
    for (int64_t layer : spec.global_layer_ids()) {
      INFO("layer " << layer);
      const auto alone = span.evaluate(span.reference_site(layer), items[i].candidates, "test");
      calib::ActivationStream stream(*model, seqs, 2, calib::ActivationPlacement::kAuto);
      arch::ExactAttentionCore full(16);
      for (int64_t j = 0; j < layer; ++j)
        stream.apply([&](const at::Tensor& h) {
          return model->run_layer(j, h, {&full, nullptr, 0});
        });
      for (size_t c = 0; c < assignments[i].size(); ++c) {
        CHECK(swept[i][c] == Approx(alone[c]).margin(1e-9));
        CHECK(alone[c] == Approx(exact.evaluate(layer, stream, assignments[i][c])).margin(2e-5));
      }
      ++i;
    }
  }
}

// Each global layer in `windows` keeps its windows for queries at positions >= `from`, full KV
// before; every other layer runs exactly.
class PolicyOnSpanCore final : public arch::AttentionCore {
 public:
  PolicyOnSpanCore(std::map<int64_t, std::vector<int64_t>> windows, int64_t from, int64_t sinks)
      : windows_(std::move(windows)), from_(from), sinks_(sinks) {}
  at::Tensor attend(const arch::AttentionInputs& in) override {
    arch::ExactAttentionCore exact(16);
    at::Tensor full = exact.attend(in);
    const auto it = windows_.find(in.layer_id);
    if (it == windows_.end()) return full;
    const at::Tensor windowed = arch::windowed_attention(in, it->second, sinks_, 16);
    full.slice(1, from_, full.size(1)).copy_(windowed.slice(1, from_, windowed.size(1)));
    return full;
  }

 private:
  std::map<int64_t, std::vector<int64_t>> windows_;
  int64_t from_;
  int64_t sinks_;
};

TEST_CASE(
    "answer span: a whole policy measures as the forward with every layer's windows on the span; "
    "a share of the sequences as a span of those sequences",
    "[calib]") {
  // evaluate_policies checks a re-solve's proposal; SweepItem::sequences probes the layers above
  // the lowest on a share of the sequences.
  c10::InferenceMode inference;
  for (const char* name : {"qwen3_next_tiny", "gemma3_gqa4", "jamba_tiny"}) {
    INFO(name);
    auto model = fixture_model(name);
    const auto& spec = model->spec();
    const auto seqs = random_sequences(3, 48, spec.vocab_size, 13);
    const std::vector<std::vector<int64_t>> answers(seqs.size(), {36, 41, 46});
    calib::AnswerSpanOptions so;
    so.micro_batch = 2;  // micro-batches of 2 and 1 sequences
    so.windows = {4, 8, kFullWindow};
    so.sink_tokens = 1;
    so.margin = 6;
    calib::AnswerSpan span(*model, seqs, answers, so);
    const std::vector<int64_t> globals = spec.global_layer_ids();
    REQUIRE(!globals.empty());
    // Two policies that agree below the lowest global layer: one cuts every global layer, the
    // other only the lowest.
    std::map<int64_t, std::vector<int64_t>> every, lowest_only;
    for (int64_t layer : globals) {
      const auto heads = static_cast<size_t>(spec.layer(layer).attention->num_kv_heads);
      std::vector<int64_t> mixed(heads, 4);
      mixed[0] = 8;
      every[layer] = mixed;
      lowest_only[layer] =
          layer == globals.front() ? mixed : std::vector<int64_t>(heads, kFullWindow);
    }
    calib::ActivationStream stream(*model, seqs, 2, calib::ActivationPlacement::kAuto);
    arch::ExactAttentionCore exact(16);
    for (int64_t i = 0; i < globals.front(); ++i)
      stream.apply([&](const at::Tensor& h) {
        return model->run_layer(i, h, {&exact, nullptr, 0});
      });
    const auto values =
        span.evaluate_policies(globals.front(), stream, {every, lowest_only}, "test");
    REQUIRE(values.size() == 2);
    PolicyOnSpanCore every_core(every, span.span_begin(), 1);
    PolicyOnSpanCore lowest_core(lowest_only, span.span_begin(), 1);
    CHECK(values[0] == Approx(forward_divergence(*model, seqs, answers, every_core)).margin(2e-5));
    CHECK(values[1] == Approx(forward_divergence(*model, seqs, answers, lowest_core)).margin(2e-5));
    // With one global layer the policies are one candidate of it.
    const calib::SpanSite& site = span.reference_site(globals.front());
    CHECK(values[1] ==
          Approx(span.evaluate(site, {site.compose(lowest_only.at(globals.front()))}, "test")[0])
              .margin(1e-9));
    if (globals.size() > 1) CHECK(values[0] != Approx(values[1]).margin(1e-7));

    // The first n sequences of a sweep measure what a span of those sequences alone measures.
    for (const int64_t n : {1, 2}) {
      INFO(n << " sequences");
      const std::vector<std::vector<int64_t>> first(seqs.begin(), seqs.begin() + n);
      const std::vector<std::vector<int64_t>> first_answers(answers.begin(), answers.begin() + n);
      calib::AnswerSpan alone(*model, first, first_answers, so);
      REQUIRE(alone.span_begin() == span.span_begin());
      for (int64_t layer : globals) {
        INFO("layer " << layer);
        const auto& w = every.at(layer);
        calib::AnswerSpan::SweepItem share{&span.reference_site(layer), {}};
        share.candidates = {span.reference_site(layer).compose(w)};
        share.sequences = n;
        calib::AnswerSpan::SweepItem all{&span.reference_site(layer), share.candidates};
        const auto swept = span.sweep({share, all}, "test");
        const calib::SpanSite& own = alone.reference_site(layer);
        CHECK(swept[0][0] == Approx(alone.evaluate(own, {own.compose(w)}, "test")[0]).margin(1e-6));
        CHECK(swept[1][0] ==
              Approx(span.evaluate(span.reference_site(layer), share.candidates, "test")[0])
                  .margin(1e-9));
      }
    }
  }
}

TEST_CASE("answer span: bad margins and answers outside the sequence are refused", "[calib]") {
  c10::InferenceMode inference;
  auto model = arch::load_model(testing::fixture_dir("qwen3_next_tiny"), {});
  const auto seqs = random_sequences(1, 24, model->spec().vocab_size, 1);
  calib::AnswerSpanOptions so;
  so.margin = -1;
  CHECK_THROWS_WITH(calib::AnswerSpan(*model, seqs, {{20}}, so), Catch::Contains("--span-margin"));
  so.margin = 4;
  CHECK_THROWS_WITH(calib::AnswerSpan(*model, seqs, {{24}}, so),
                    Catch::Contains("outside its 24 tokens"));
  CHECK_THROWS_WITH(calib::AnswerSpan(*model, seqs, {{}}, so),
                    Catch::Contains("no answer positions"));
}
