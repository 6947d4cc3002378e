#pragma once
// The fits after the walk (calibration_job.cpp): the walk's completed windows fitted to vLLM's
// exact reservation (--engine vllm) and to tensor parallelism's shards (--tensor-parallel-size).
// Each replaces the result's windows, distortions, bytes and total, so the report and the policy
// state what the fit chose.
#include "calib/job/job_state.hpp"
#include "headwise/calib/calibration_job.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/calib/tensor_parallel.hpp"

namespace headwise::calib {

// vLLM's reservation couples the heads the walk priced one by one (calib/engine.hpp).
EngineFitRecord fit_to_vllm(const CalibrationJob::State& s, SeqCalibResult& result);

// vLLM builds one cache layout for every rank: re-solve under the shard constraint.
TensorParallelFit fit_to_shards(const CalibrationJob::State& s, SeqCalibResult& result);

}  // namespace headwise::calib
