// Test-injected kill hook for the resume tests (LD_PRELOAD; never part of the shipped binary).
// With HEADWISE_KILL_AFTER_CHECKPOINTS=n, the n-th rename() onto a path ending in ".ckpt.json"
// (the calibration checkpoint, written atomically by a rename) completes and then the process
// SIGKILLs itself, like an out-of-memory kill or a pre-empted job right after that checkpoint.
#include <dlfcn.h>

#include <csignal>
#include <cstdlib>
#include <string_view>

extern "C" int rename(const char* from, const char* to) {
  using Rename = int (*)(const char*, const char*);
  static const auto real_rename = reinterpret_cast<Rename>(::dlsym(RTLD_NEXT, "rename"));
  static int remaining = [] {
    const char* text = std::getenv("HEADWISE_KILL_AFTER_CHECKPOINTS");
    return text != nullptr ? std::atoi(text) : 0;
  }();
  const int result = real_rename(from, to);
  if (result == 0 && remaining > 0 && std::string_view(to).ends_with(".ckpt.json") &&
      --remaining == 0) {
    std::raise(SIGKILL);
  }
  return result;
}
