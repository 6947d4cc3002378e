#pragma once
// The built-in calibration set used when no --calib file is given: retrieval-style token
// sequences over the model's own vocabulary, generated from a seed. Each sequence is filler
// with local structure (repeated short phrases, which local heads can model) with key→value
// needles planted at spread-out depths, and ends by querying every key, so answering needs
// attention reaching back to the needle wherever it was planted.
#include <cstdint>
#include <string>
#include <vector>

namespace headwise::tasks {

// A needle reads MARKER key SEP value, and so does its query (the value being the answer).
inline constexpr int64_t kSyntheticKeyLen = 2;
inline constexpr int64_t kSyntheticValueLen = 3;

struct SyntheticOptions {
  int64_t vocab_size = 0;
  int64_t samples = 8;
  int64_t seq_len = 2048;
  uint64_t seed = 0;
  int64_t needles = 0;  // key→value pairs per sequence; 0 = one per 512 tokens, 1 to 8
};

std::vector<std::vector<int64_t>> synthetic_retrieval_set(const SyntheticOptions& options);

// Variable tracking in the same format (RULER's multi-hop task over token ids): the `needles`
// (at least 2) form one chain, every key after the first being the first kSyntheticKeyLen tokens
// of the previous needle's value; they are planted at spread depths in shuffled order, and the
// sequence ends with the chain's queries in chain order. So the key of each query after the
// first is the answer to the query before: recalling hop h needs every needle up to h.
std::vector<std::vector<int64_t>> synthetic_chain_set(const SyntheticOptions& options);

// The answer positions of every sequence of that set (the same for all): the positions whose
// next token is a queried value token, i.e. where the model must have retrieved the needle.
std::vector<int64_t> synthetic_answer_positions(const SyntheticOptions& options);

// Identifies the generator and its parameters in a policy's provenance.
std::string synthetic_set_description(const SyntheticOptions& options);

}  // namespace headwise::tasks
