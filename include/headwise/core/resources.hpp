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

// Fixes the intra-op thread count for the whole process at what it is now (OMP_NUM_THREADS, or
// one per core), for OpenMP and MKL alike, and turns MKL's dynamic thread adjustment off. Why:
// MKL splits a matrix product's rows among its threads, and the rows of each share come out of
// a kernel run of their own, so the bits of a row depend on how many threads MKL used for that
// call (a gemma3 fixture's logits at 2 threads differ from 1 thread's in exactly the second half
// of the positions). MKL_DYNAMIC is on by default and lets MKL use fewer threads than asked on
// any call; torch turns it off only inside at::set_num_threads, which headwise-calc never called
// outside `eval --jobs`. Returns the thread count.
int pin_intra_op_threads();

}  // namespace headwise
