#include "headwise/core/progress.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>

namespace headwise {
namespace {

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s / 60) % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace

Progress::Progress(std::string what, int64_t total)
    : what_(std::move(what)),
      total_(total),
      tty_(::isatty(STDERR_FILENO) != 0 && spdlog::should_log(spdlog::level::info)),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  finish();
}

double Progress::elapsed_seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::update(int64_t done, const std::string& detail) {
  const double elapsed = elapsed_seconds();
  const std::string eta = done > 0 && done < total_
                              ? format_duration(elapsed / static_cast<double>(done) *
                                                static_cast<double>(total_ - done))
                              : "-";
  const std::string line = fmt::format("{} {}/{} [{} elapsed, ETA {}] {}", what_, done, total_,
                                       format_duration(elapsed), eta, detail);
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line.c_str());
    std::fflush(stderr);
  } else {
    spdlog::info("{}", line);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_) std::fprintf(stderr, "\n");
}

}  // namespace headwise
