#pragma once
// What a window level costs when the calibration sequences cannot measure it (a level at or
// beyond --seq-len and below --context: on sequences that short it attends like full KV).
// `--extrapolate` names the rule; a level neither measured nor covered by one is refused.
//  - as-full: the level costs what full KV costs (0 added): the solver takes it over full
//    whenever it is cheaper, so it says "this level is as good as full".
//  - power-law: each head's curve is fitted over its measured finite levels as
//    d(w) = c * w^b (least squares in log-log, b clamped to <= 0: a longer window never costs
//    more), and read at the unmeasured level, capped at the largest measured finite level's
//    value. The cost of what a window drops falls with distance like the attention mass beyond
//    it, which decays roughly as a power of the distance in long-context models. With fewer than
//    two measured levels above zero the curve's value at its largest measured finite level is
//    used (conservative: no decay assumed); with none, 0.
#include <cstdint>
#include <string>
#include <vector>

#include "headwise/solve/mckp.hpp"

namespace headwise::calib {

enum class Extrapolation { kNone, kAsFull, kPowerLaw };

// "none", "as-full" or "power-law"; InputError naming --extrapolate otherwise.
Extrapolation parse_extrapolation(const std::string& text);
const char* extrapolation_name(Extrapolation rule);

// Replaces, in every group (one head's curve), the distortion of the options whose window is in
// `unmeasured` by the rule's value, from the group's other options. as-full and none change
// nothing (the measured value of such a level already equals full KV's).
void extrapolate_curves(std::vector<solve::Group>& groups, const std::vector<int64_t>& unmeasured,
                        Extrapolation rule);

}  // namespace headwise::calib
