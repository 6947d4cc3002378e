#pragma once
// A calibration's head curves as the knapsack's groups: one group per KV head, one option per
// ladder level (its window, bytes and measured distortion), in the curves' order. The inverse of
// what the walk records (seqcalib_curves.cpp: to_curves).
#include <vector>

#include "headwise/calib/seqcalib.hpp"
#include "headwise/solve/mckp.hpp"

namespace headwise::calib {

std::vector<solve::Group> curve_groups(const std::vector<HeadCurve>& curves);

}  // namespace headwise::calib
