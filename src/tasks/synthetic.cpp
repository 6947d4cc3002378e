#include "headwise/tasks/synthetic.hpp"

#include <algorithm>
#include <numeric>

#include "headwise/core/error.hpp"
#include "headwise/core/rng.hpp"

namespace headwise::tasks {
namespace {

constexpr int64_t kKeyLen = kSyntheticKeyLen;
constexpr int64_t kValueLen = kSyntheticValueLen;
constexpr int64_t kPhrases = 24;

// How the needles of a sequence relate. Independent: every key is fresh, needle n is planted
// n-th, the queries come in shuffled order. Chained (variable tracking): each key after the first
// is the start of the previous needle's value, the planting order is shuffled so that the text's
// order says nothing of the chain's, and the queries follow the chain.
enum class NeedleLinks { kIndependent, kChained };

struct Alphabet {
  int64_t needle_marker;
  int64_t separator;
  int64_t first_content;  // content tokens: [first_content, vocab)
  int64_t vocab;
};

int64_t content_token(Rng& rng, const Alphabet& a) {
  return a.first_content + rng.below(a.vocab - a.first_content);
}

std::vector<int64_t> needle(const std::vector<int64_t>& key, const std::vector<int64_t>& value,
                            const Alphabet& a) {
  std::vector<int64_t> out{a.needle_marker};
  out.insert(out.end(), key.begin(), key.end());
  out.push_back(a.separator);
  out.insert(out.end(), value.begin(), value.end());
  return out;
}

std::vector<int64_t> in_order(int64_t n) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  return order;
}

// A uniformly random order of 0..n-1.
std::vector<int64_t> shuffled_order(Rng& rng, int64_t n) {
  std::vector<int64_t> order = in_order(n);
  rng.shuffle(order);
  return order;
}

std::vector<int64_t> one_sequence(Rng& rng, const SyntheticOptions& o, const Alphabet& a,
                                  const std::vector<std::vector<int64_t>>& phrases,
                                  NeedleLinks links) {
  const bool chained = links == NeedleLinks::kChained;
  std::vector<std::vector<int64_t>> keys, values;
  for (int64_t n = 0; n < o.needles; ++n) {
    std::vector<int64_t> key, value;
    if (chained && n > 0) {
      key.assign(values.back().begin(), values.back().begin() + kKeyLen);
    } else {
      for (int64_t i = 0; i < kKeyLen; ++i) key.push_back(content_token(rng, a));
    }
    for (int64_t i = 0; i < kValueLen; ++i) value.push_back(content_token(rng, a));
    keys.push_back(key);
    values.push_back(value);
  }
  const int64_t needle_len = 2 + kKeyLen + kValueLen;
  const int64_t query_len = o.needles * needle_len;
  const int64_t haystack_len = o.seq_len - query_len;
  // Needle n sits near depth (n + u) / needles of the haystack, u uniform: spread, not clumped.
  std::vector<int64_t> depths;
  for (int64_t n = 0; n < o.needles; ++n) {
    const double u = rng.unit();
    depths.push_back(
        static_cast<int64_t>((static_cast<double>(n) + u) / static_cast<double>(o.needles) *
                             static_cast<double>(std::max<int64_t>(1, haystack_len - needle_len))));
  }
  const std::vector<int64_t> planted =
      chained ? shuffled_order(rng, o.needles) : in_order(o.needles);
  std::vector<int64_t> seq;
  seq.reserve(static_cast<size_t>(o.seq_len));
  size_t next_needle = 0;
  while (static_cast<int64_t>(seq.size()) < haystack_len) {
    if (next_needle < depths.size() && static_cast<int64_t>(seq.size()) >= depths[next_needle]) {
      const auto which = static_cast<size_t>(planted[next_needle]);
      const auto n = needle(keys[which], values[which], a);
      seq.insert(seq.end(), n.begin(), n.end());
      ++next_needle;
      continue;
    }
    const auto& phrase = phrases[static_cast<size_t>(rng.below(kPhrases))];
    seq.insert(seq.end(), phrase.begin(), phrase.end());
  }
  seq.resize(static_cast<size_t>(haystack_len));
  // The queries: marker, key, separator, then the value to be recalled.
  for (int64_t n : chained ? in_order(o.needles) : shuffled_order(rng, o.needles)) {
    const auto q = needle(keys[static_cast<size_t>(n)], values[static_cast<size_t>(n)], a);
    seq.insert(seq.end(), q.begin(), q.end());
  }
  HEADWISE_CHECK(static_cast<int64_t>(seq.size()) == o.seq_len, "synthetic length {} != {}",
                 seq.size(), o.seq_len);
  return seq;
}

std::vector<std::vector<int64_t>> synthetic_set(const SyntheticOptions& options,
                                                NeedleLinks links) {
  SyntheticOptions o = options;
  if (o.needles == 0) o.needles = std::clamp<int64_t>(o.seq_len / 512, 1, 8);
  if (o.vocab_size < 16)
    throw_input_error("synthetic calibration needs a vocabulary of at least 16 tokens, got {}",
                      o.vocab_size);
  if (o.samples <= 0) throw_field_error("samples", " must be positive");
  if (o.needles <= 0) throw_input_error("synthetic calibration: needles must be positive");
  const int64_t needle_len = 2 + kKeyLen + kValueLen;
  if (o.seq_len < 4 * o.needles * needle_len) {
    throw_field_error("seq_len", " {} is too short for {} needles (need at least {})", o.seq_len,
                      o.needles, 4 * o.needles * needle_len);
  }
  // Low ids are often special tokens in real vocabularies; stay clear of the first few.
  const int64_t reserved = std::min<int64_t>(o.vocab_size / 8, 256);
  const Alphabet alphabet{reserved, reserved + 1, reserved + 2, o.vocab_size};
  Rng rng(o.seed);
  std::vector<std::vector<int64_t>> phrases;
  for (int64_t p = 0; p < kPhrases; ++p) {
    std::vector<int64_t> phrase;
    const int64_t len = rng.between(3, 8);
    for (int64_t i = 0; i < len; ++i) phrase.push_back(content_token(rng, alphabet));
    phrases.push_back(std::move(phrase));
  }
  std::vector<std::vector<int64_t>> set;
  for (int64_t s = 0; s < o.samples; ++s)
    set.push_back(one_sequence(rng, o, alphabet, phrases, links));
  return set;
}

}  // namespace

std::vector<std::vector<int64_t>> synthetic_retrieval_set(const SyntheticOptions& options) {
  return synthetic_set(options, NeedleLinks::kIndependent);
}

std::vector<std::vector<int64_t>> synthetic_chain_set(const SyntheticOptions& options) {
  if (options.needles < 2) {
    throw_input_error("synthetic variable tracking needs a chain of at least 2 needles, got {}",
                      options.needles);
  }
  return synthetic_set(options, NeedleLinks::kChained);
}

std::vector<int64_t> synthetic_answer_positions(const SyntheticOptions& options) {
  SyntheticOptions o = options;
  if (o.needles == 0) o.needles = std::clamp<int64_t>(o.seq_len / 512, 1, 8);
  const int64_t needle_len = 2 + kKeyLen + kValueLen;
  const int64_t first_query = o.seq_len - o.needles * needle_len;
  std::vector<int64_t> positions;
  for (int64_t n = 0; n < o.needles; ++n) {
    // A query reads: marker, key, separator, value. The separator's position predicts the
    // first value token; the last value token predicts nothing of the answer.
    const int64_t separator = first_query + n * needle_len + 1 + kKeyLen;
    for (int64_t i = 0; i < kValueLen; ++i) positions.push_back(separator + i);
  }
  return positions;
}

std::string synthetic_set_description(const SyntheticOptions& options) {
  SyntheticOptions o = options;
  if (o.needles == 0) o.needles = std::clamp<int64_t>(o.seq_len / 512, 1, 8);
  return fmt::format(
      "builtin:synthetic-retrieval(vocab={},samples={},seq_len={},needles={},seed={})",
      o.vocab_size, o.samples, o.seq_len, o.needles, o.seed);
}

}  // namespace headwise::tasks
