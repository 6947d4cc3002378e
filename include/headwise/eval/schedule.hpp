#pragma once
// Eval's method runs on several workers at once (`eval --jobs N`).
//
// A method run is one decoder over every sample; runs of different methods are independent once
// the full-KV reference (their KL's reference) exists, so they parallelise without changing any
// figure. A DecoderModel streams its layers through mutable state, so each worker owns a model
// instance of its own: at N jobs the process holds N streamed layers and N activation sets, which
// is nothing on a tiny model and one more layer per job on a large one (default: one job).
//
// The first worker is also the builder: it builds the methods (the baselines' training, e.g.
// duo's gates, is the long part at long contexts) and hands each to the queue as soon as it
// exists, so the other workers run full KV and the methods built so far meanwhile. Two methods with
// the same windows and the same eviction rule compute the same numbers; the second reuses the
// first's run (said in the log) instead of repeating it.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "headwise/eval/eval.hpp"

namespace headwise::eval {

// Hands method number `slot` (its place in the report) of policy `policy` (an index into the
// caller's list) to the queue; a method named "full" gets the full-KV reference run as its result.
// Slots may come in any order (cheap baselines before duo's training, so the other workers have
// runs meanwhile), each once; a policy's slots must end up as 0..n-1.
using EmitMethod = std::function<void(size_t policy, size_t slot, MethodWindows method)>;
// Builds every policy's methods on `model` (the builder's own instance).
using BuildMethods = std::function<void(arch::DecoderModel& model, const EmitMethod& emit)>;

struct ScheduleOptions {
  // Intra-op threads of each worker when there are several (0: the process's threads divided
  // by the workers, at least 1). One worker keeps the process's thread settings untouched.
  int64_t threads_per_worker = 0;
};

struct ScheduledRuns {
  MethodResult full;                                // the reference, run once
  std::vector<std::vector<MethodWindows>> methods;  // per policy, by slot
  std::vector<std::vector<MethodResult>> results;   // the same shape (name only: does_not_fit)
  int64_t runs_executed = 0;                        // runs the decoder did (full included)
  int64_t runs_reused = 0;                          // methods answered by an identical run
};

// Runs full KV first, then every emitted method, on `models.size()` workers (one model each,
// all loaded from the same checkpoint). Each result equals what run_method gives for that
// method alone at the workers' thread count. An error in any worker stops the others at their
// next run and is rethrown here.
ScheduledRuns run_scheduled(const std::vector<std::unique_ptr<arch::DecoderModel>>& models,
                            size_t policies, const BuildMethods& build,
                            const memory::MemoryOptions& options,
                            const std::vector<EvalSample>& samples, const RunOptions& run,
                            const ScheduleOptions& schedule = {});

}  // namespace headwise::eval
