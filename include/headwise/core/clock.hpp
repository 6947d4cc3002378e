#pragma once
// Elapsed seconds for the timings reports print (calibration phases, eval throughput): measured
// on the steady clock, which a change of the system time cannot make run backwards.
#include <chrono>

namespace headwise {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace headwise
