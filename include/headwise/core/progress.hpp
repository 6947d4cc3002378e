#pragma once
// A progress line with ETA for long work: redrawn in place on a terminal, a log line per
// step otherwise (CI logs), silent under --quiet.
#include <chrono>
#include <cstdint>
#include <string>

namespace headwise {

class Progress {
 public:
  Progress(std::string what, int64_t total);
  ~Progress();
  // Marks `done` of `total` steps finished; `detail` is shown after the counter.
  void update(int64_t done, const std::string& detail);
  void finish();
  double elapsed_seconds() const;

 private:
  std::string what_;
  int64_t total_;
  bool tty_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace headwise
