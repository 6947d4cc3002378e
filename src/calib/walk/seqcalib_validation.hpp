#pragma once
// Validation of a predicted answer measure (answer-grad, or the answer-span measures) against the
// exact answer-kl measure of the same windows: the probe's (head, level) pairs and each layer's
// joint decision, collected into the run's validation (SeqCalibResult::validation) and summarised
// in the log.
#include <cstdint>
#include <vector>

#include "calib/walk/joint_descent.hpp"
#include "calib/walk/seqcalib_run.hpp"
#include "headwise/calib/activations.hpp"
#include "headwise/calib/answer_reference.hpp"

namespace headwise::calib::seqcalib {

// The probe's predicted (head, level) pairs of one layer against the exact measure.
void validate_probe_pairs(const RunInputs& in, AnswerReference& exact, int64_t layer_id,
                          ActivationStream& stream, const std::vector<solve::Group>& predicted,
                          MeasureValidation& validation);

// Every probe (head, finite level) pair of the span measure against the exact measure, on a
// full-KV walk of the same sequences.
void validate_span_probe(const RunInputs& in, AnswerReference& exact,
                         const std::map<int64_t, std::vector<solve::Group>>& probe_groups,
                         MeasureValidation& validation);

// The chosen joint windows' predicted added KL against the measured one; `with_own_decision` (the
// span measure's) also the exact measure's own decision on the same stream (the same descent,
// allowance and price), and what it costs by the exact measure. Records it in state.validation
// and counts the exact evaluations in state.answer_evaluations.
void validate_joint_decision(const RunInputs& in, AnswerReference& exact, int64_t layer_id,
                             ActivationStream& stream, const std::vector<size_t>& assign,
                             const JointMeasure& predicted, const std::vector<solve::Group>& groups,
                             int64_t allowance, double price, bool with_own_decision,
                             RunState& state);

// The Spearman correlation over the pairs, and every joint decision, in the log.
void summarise_validation(const RunInputs& in, MeasureValidation& validation);

}  // namespace headwise::calib::seqcalib
