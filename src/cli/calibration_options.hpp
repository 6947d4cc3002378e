#pragma once
// The main command's options, from text (its flags, or a regen manifest entry) to types: every
// size, ladder and enum is parsed here, once, with the flag named in the error.
#include "headwise/calib/calibration_job.hpp"

namespace headwise::cli {

calib::CalibrationOptions calibration_options(const calib::CalibrationRequest& request);

}  // namespace headwise::cli
