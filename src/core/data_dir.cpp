#include "headwise/core/data_dir.hpp"

#include <algorithm>
#include <cstdlib>

#include "headwise/core/error.hpp"

namespace headwise {
namespace fs = std::filesystem;

namespace {

bool holds_data(const fs::path& dir) {
  std::error_code ec;
  return fs::is_directory(dir / "calib-data", ec);
}

fs::path running_binary() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec);  // empty where /proc is unavailable
}

// True when `path` lies inside `dir` (both made absolute and normal).
bool is_inside(const fs::path& path, const fs::path& dir) {
  const fs::path p = fs::weakly_canonical(path), d = fs::weakly_canonical(dir);
  const auto mismatch = std::mismatch(d.begin(), d.end(), p.begin(), p.end());
  return mismatch.first == d.end();
}

}  // namespace

fs::path data_dir() {
  if (const char* env = std::getenv("HEADWISE_DATA_DIR"); env != nullptr && *env != '\0') {
    if (!holds_data(env)) throw_input_error("HEADWISE_DATA_DIR={}: has no calib-data/ folder", env);
    return env;
  }
  const fs::path binary = running_binary();
  if (binary.empty()) {
    throw_input_error(
        "headwise's data (calib-data/) not found (/proc/self/exe unreadable); set "
        "HEADWISE_DATA_DIR to the "
        "folder holding calib-data/");
  }
  const fs::path installed = binary.parent_path().parent_path() / "share" / "headwise";
  if (holds_data(installed)) return installed;
  // A binary in its build tree (the tests, a developer's build) reads the source tree.
  if (is_inside(binary, HEADWISE_BUILD_DIR) && holds_data(HEADWISE_SOURCE_DIR))
    return HEADWISE_SOURCE_DIR;
  throw_input_error(
      "headwise's data (calib-data/) not found (looked in {}); set HEADWISE_DATA_DIR to the folder "
      "holding calib-data/",
      installed.string());
}

}  // namespace headwise
