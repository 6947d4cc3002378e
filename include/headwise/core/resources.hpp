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

// CPU tensors of tens of MiB (attention scores of a query chunk, activations of a layer) are
// allocated and freed thousands of times per run. glibc serves blocks above its mmap threshold
// (at most 32 MiB) with fresh mmaps, so every such tensor is a munmap and a page fault per 4 KiB
// on reuse: a third of a long forward's wall time went to the kernel zeroing pages. Raising the
// threshold to 256 MiB and keeping up to 512 MiB of freed heap for reuse removes that
// (tools/bench-allocator.sh); the cost is up to that much freed memory held by the process. Not
// applied when the user set MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ (theirs win), or
// HEADWISE_GLIBC_MALLOC_DEFAULTS=1 (for side-by-side benchmarks). Returns whether it applied.
bool tune_allocator_for_tensor_reuse();

}  // namespace headwise
