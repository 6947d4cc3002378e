#pragma once
// The search inside one global layer of the answer-aware measures (seqcalib_decide.cpp decides
// with it): each head's window is a level index into its group's options, and `JointMeasure`
// prices a whole assignment of the layer (measured or predicted answer KL). Deterministic: ties go
// to the lower head and level.
#include <cstdint>
#include <functional>
#include <vector>

#include "headwise/solve/mckp.hpp"

namespace headwise::calib {

using JointMeasure = std::function<double(const std::vector<size_t>& levels)>;
// Told every assignment a step is about to price, before it prices them one by one: a measure that
// runs candidates in batches (answer_span.hpp) measures them all at once. May be empty.
using JointPrefetch = std::function<void(const std::vector<std::vector<size_t>>& assignments)>;

// Every distinct ordering of `levels` among the heads, in lexicographic order (the sorted one
// first): the assignments that give a layer the same levels, for one batch of a prefetch.
std::vector<std::vector<size_t>> distinct_orderings(std::vector<size_t> levels);

// Bytes of the layer with head h at level assign[h].
int64_t layer_bytes(const std::vector<solve::Group>& groups, const std::vector<size_t>& assign);

// From every head at its top level: cut (least KL added per byte saved) until the layer fits
// `allowance`; with `price` >= 0, keep cutting while a cut adds less than `price` per byte; then
// lengthen within the allowance while a lengthening removes KL (more than `price` per byte).
std::vector<size_t> greedy_joint_descent(const std::vector<solve::Group>& groups, int64_t allowance,
                                         const JointMeasure& joint, double price,
                                         const JointPrefetch& prefetch = {});

// The best move of one head, or of two heads at once, that keeps the layer within `allowance`
// and lowers `measure`; applied, returns true.
bool best_swap(const std::vector<solve::Group>& groups, std::vector<size_t>& assign,
               int64_t allowance, const JointMeasure& measure, const JointPrefetch& prefetch = {});

}  // namespace headwise::calib
