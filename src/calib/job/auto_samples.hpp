#pragma once
// `--samples auto` (issue 59, docs/seqcalib.md): a sequential rule for the number of calibration
// sequences. The calibration starts at kAutoFirstSamples; after each round the walk's decision
// noise (DecisionNoise per walked layer) says which decisions the sequences did not separate and
// how many sequences a normal approximation says would (`sequences_to_separate`). The rule draws
// more only for those within the cap: the others need hundreds (docs/seqcalib.md), and no round
// the cost goals allow would settle them.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "headwise/calib/seqcalib.hpp"

namespace headwise::calib {

// The first round: the main command's default --samples, so a first round that separates every
// decision gives the default's policy.
inline constexpr int64_t kAutoFirstSamples = 8;

// Whether one walked layer's decision asks for more sequences under `cap`: not separated, and its
// need (a finite sequences_to_separate: the gap is positive) within the cap.
bool wants_more_samples(const DecisionNoise& noise, int64_t cap);

// The next round's sequences after a round of `samples`, or nothing when the rule stops: every
// decision separated, every unseparated one beyond the cap, or the cap reached. Otherwise the
// larger of twice `samples` and the largest need within the cap rounded up to a multiple of 8,
// at most the cap: doubling bounds the rounds (8, 16, 32 at the default cap), the need lets one
// round reach what a layer asks for.
std::optional<int64_t> next_samples(const std::vector<DecisionNoise>& noise, int64_t samples,
                                    int64_t cap);

// One line for the log: the layers not separated and what each needs ("layer 3 needs 86").
std::string unseparated_summary(const std::vector<DecisionNoise>& noise);

}  // namespace headwise::calib
