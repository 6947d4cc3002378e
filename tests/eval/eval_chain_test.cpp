// eval's multi-hop task: needle_chain's samples (variable tracking over token ids) and the
// harness that feeds each next query with the model's own previous answer.
#include <catch2/catch.hpp>

#include <algorithm>

#include "../arch/fixture_reference.hpp"
#include "headwise/eval/eval.hpp"
#include "headwise/eval/tasks.hpp"

using namespace headwise;

namespace {

// `count` tokens of `answer` from index `first`.
std::vector<int64_t> tokens_at(const std::vector<int64_t>& answer, int64_t first, int64_t count) {
  return {answer.begin() + first, answer.begin() + first + count};
}

// Where `needle` occurs in `prompt`, every start.
std::vector<int64_t> occurrences(const std::vector<int64_t>& prompt,
                                 const std::vector<int64_t>& needle) {
  std::vector<int64_t> out;
  for (auto it = prompt.begin();
       (it = std::search(it, prompt.end(), needle.begin(), needle.end())) != prompt.end(); ++it) {
    out.push_back(it - prompt.begin());
  }
  return out;
}

}  // namespace

TEST_CASE(
    "needle_chain is variable tracking: each query after the first asks for the key the hop before "
    "answered",
    "[eval]") {
  eval::TaskRequest request;
  request.tasks = {"needle_chain"};
  request.samples = 12;
  request.seq_len = 512;
  request.seed = 5;
  const auto samples =
      eval::make_eval_samples(headwise::testing::fixture_dir("qwen3_next_tiny"), 512, request);
  REQUIRE(samples.size() == 12);
  constexpr int64_t kHops = 4, kKey = 2, kValue = 3;
  const int64_t marker = 64, separator = 65;  // the set's reserved ids for a 512-token vocabulary
  int64_t planted_out_of_chain_order = 0;
  for (const auto& s : samples) {
    INFO("sample " << (&s - samples.data()));
    CHECK(static_cast<int64_t>(s.prompt.size() + s.answer.size()) == request.seq_len);
    REQUIRE(s.answer_source.size() == s.answer.size());
    REQUIRE(static_cast<int64_t>(s.answer.size()) == kValue + (kHops - 1) * (2 + kKey + kValue));
    CHECK(static_cast<int64_t>(eval::generated_answer_indices(s).size()) == kHops * kValue);
    // The prompt ends with the first query: marker, key, separator.
    std::vector<int64_t> key(s.prompt.end() - 1 - kKey, s.prompt.end() - 1);
    CHECK(s.prompt[s.prompt.size() - 2 - kKey] == marker);
    CHECK(s.prompt.back() == separator);
    std::vector<int64_t> planted_at;
    int64_t value_start = 0;
    for (int64_t hop = 0; hop < kHops; ++hop) {
      INFO("hop " << hop);
      if (hop > 0) {
        const int64_t query = value_start + kValue;  // the marker after the previous value
        CHECK(s.answer_source[query] == eval::kGivenToken);
        CHECK(s.answer[query] == marker);
        for (int64_t i = 0; i < kKey; ++i) CHECK(s.answer_source[query + 1 + i] == value_start + i);
        CHECK(s.answer_source[query + 1 + kKey] == eval::kGivenToken);
        CHECK(s.answer[query + 1 + kKey] == separator);
        // The key is the first tokens of the previous hop's value.
        key = tokens_at(s.answer, query + 1, kKey);
        CHECK(key == tokens_at(s.answer, value_start, kKey));
        value_start = query + 2 + kKey;
      }
      for (int64_t i = 0; i < kValue; ++i)
        CHECK(s.answer_source[value_start + i] == eval::kGeneratedToken);
      // This hop's needle is planted once in the prompt, with this key and this value.
      std::vector<int64_t> needle{marker};
      needle.insert(needle.end(), key.begin(), key.end());
      needle.push_back(separator);
      const auto value = tokens_at(s.answer, value_start, kValue);
      needle.insert(needle.end(), value.begin(), value.end());
      const auto at = occurrences(s.prompt, needle);
      REQUIRE(at.size() == 1);
      planted_at.push_back(at[0]);
    }
    if (!std::is_sorted(planted_at.begin(), planted_at.end())) ++planted_out_of_chain_order;
    // Teacher forcing: the generated rows predict exactly the value tokens.
    const auto forced = eval::teacher_forced(s);
    REQUIRE(forced.generated_rows.size() == static_cast<size_t>(kHops * kValue));
    for (size_t k = 0; k < forced.generated_rows.size(); ++k) {
      const int64_t i = eval::generated_answer_indices(s)[k];
      CHECK(forced.generated_rows[k] == forced.first_answer_row + i);
    }
  }
  // The text's order says nothing of the chain's (all 12 in order would happen with p = 24^-12).
  CHECK(planted_out_of_chain_order > 0);
  // Its own sample stream: not needle_multikey's (the same needle count).
  request.tasks = {"needle_multikey"};
  CHECK(eval::make_eval_samples(headwise::testing::fixture_dir("qwen3_next_tiny"), 512, request)[0]
            .prompt != samples[0].prompt);
}

TEST_CASE(
    "the multi-hop harness feeds the model's own answer into the next query, not the reference",
    "[eval]") {
  c10::InferenceMode inference;
  const auto dir = headwise::testing::fixture_dir("qwen3_next_tiny");
  auto model = arch::load_model(dir, arch::ModelOptions{});
  const auto& spec = model->spec();
  eval::TaskRequest request;
  request.tasks = {"needle_chain"};
  request.samples = 3;
  request.seq_len = 160;
  const auto samples = eval::make_eval_samples(dir, spec.vocab_size, request);
  memory::MemoryOptions options;
  options.context = request.seq_len;
  options.kv_dtype = spec.dtype;
  eval::RunOptions run;
  run.attention_kernel =
      arch::AttentionKernel::kExplicit;  // the plain forward's numerics, bit for bit
  const auto result = eval::run_method(*model, {"full", memory::full_kv_windows(spec)}, options,
                                       samples, run, nullptr);
  REQUIRE(result.answer_per_sample.size() == samples.size());
  int64_t copied_a_wrong_answer = 0;
  for (size_t n = 0; n < samples.size(); ++n) {
    INFO("sample " << n);
    const auto& s = samples[n];
    const auto& produced = result.answer_per_sample[n];
    REQUIRE(produced.size() == s.answer.size());
    for (size_t i = 0; i < produced.size(); ++i) {
      const int64_t source = s.answer_source[i];
      if (source == eval::kGivenToken) CHECK(produced[i] == s.answer[i]);
      if (source >= 0) {
        CHECK(produced[i] == produced[static_cast<size_t>(source)]);
        if (produced[i] != s.answer[i]) ++copied_a_wrong_answer;
      }
    }
    CHECK(result.correct_per_sample[n] == (produced == s.answer ? 1 : 0));
    // Every generated token is the greedy choice after the prompt and what the harness fed.
    std::vector<int64_t> fed = s.prompt;
    fed.insert(fed.end(), produced.begin(), produced.end() - 1);
    const at::Tensor logits = model->forward(at::tensor(fed, at::kLong).view({1, -1}))[0];
    for (int64_t i : eval::generated_answer_indices(s)) {
      CHECK(logits[static_cast<int64_t>(s.prompt.size()) - 1 + i].argmax().item<int64_t>() ==
            produced[static_cast<size_t>(i)]);
    }
  }
  // A random-weight model answers the hops wrong, so the later queries carry its answers.
  CHECK(copied_a_wrong_answer > 0);
}
