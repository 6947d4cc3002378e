#include "headwise/core/resources.hpp"

#include <malloc.h>

#include <cstdlib>
#include <fstream>
#include <string>

#ifdef HEADWISE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace headwise {
namespace {

int64_t proc_status_bytes(const char* key) {
  std::ifstream status("/proc/self/status");
  const std::string prefix = std::string(key) + ":";
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size())) * 1024;  // kB
  }
  return 0;
}

}  // namespace

int64_t peak_rss_bytes() {
  return proc_status_bytes("VmHWM");
}
int64_t current_rss_bytes() {
  return proc_status_bytes("VmRSS");
}

bool reset_peak_rss() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

int64_t peak_device_bytes(const at::Device& device) {
#ifdef HEADWISE_WITH_CUDA
  if (device.is_cuda() && at::hasCUDA()) {
    const auto index = device.has_index() ? device.index() : c10::DeviceIndex{0};
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
        .peak;
  }
#endif
  return 0;
}

void reset_peak_device_bytes(const at::Device& device) {
#ifdef HEADWISE_WITH_CUDA
  if (device.is_cuda() && at::hasCUDA()) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(device.has_index() ? device.index()
                                                                       : c10::DeviceIndex{0});
  }
#endif
}

bool tune_allocator_for_tensor_reuse() {
  const auto set = [](const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && *value != '\0';
  };
  if (set("MALLOC_MMAP_THRESHOLD_") || set("MALLOC_TRIM_THRESHOLD_")) return false;
  if (const char* v = std::getenv("HEADWISE_GLIBC_MALLOC_DEFAULTS");
      v != nullptr && std::string(v) == "1")
    return false;
  constexpr int kMmapThreshold = 256 << 20;
  constexpr int kTrimThreshold = 512 << 20;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
}

}  // namespace headwise
