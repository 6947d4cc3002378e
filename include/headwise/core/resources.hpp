#pragma once
// Process and device memory figures for reports and benchmarks.
#include <ATen/ATen.h>

#include <cstdint>

namespace headwise {

// VmHWM / VmRSS of this process (0 where /proc is unavailable). File-backed pages of the
// memory-mapped checkpoint count too while they are resident.
int64_t peak_rss_bytes();
int64_t current_rss_bytes();
// Resets VmHWM to the current RSS (Linux /proc/self/clear_refs "5"); false where refused.
bool reset_peak_rss();

// Peak bytes allocated through the CUDA caching allocator on `device` since the last reset
// (0 for CPU devices or builds without CUDA).
int64_t peak_device_bytes(const at::Device& device);
void reset_peak_device_bytes(const at::Device& device);

}  // namespace headwise
