#pragma once
// Layer streaming: load the weights of the next layer while the current one computes.
//
// On CUDA a background thread copies each tensor from the memory-mapped checkpoint into a
// pinned host buffer (page faults and the memcpy happen off the compute thread), then queues
// the host-to-device copy and the dtype conversion on a side stream; the compute stream waits
// on an event only when the layer is first used. Peak device memory is then two layers'
// weights (the running one and the next) plus activations and workspace.
// On CPU the thread only faults the next layer's pages in (reading one byte per page), so
// disk reads overlap compute; the conversion to the compute dtype stays on the compute
// thread, where it can use the intra-op thread pool without oversubscribing the cores.
#include <ATen/ATen.h>

#include <future>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace headwise::io {
class Checkpoint;
}

namespace headwise::arch {

struct PrefetchTensor {
  std::string name;
  at::ScalarType target;  // compute dtype of this tensor
};

class LayerPrefetcher {
 public:
  LayerPrefetcher(std::shared_ptr<const io::Checkpoint> checkpoint, at::Device device);
  ~LayerPrefetcher();  // waits for a job in flight
  LayerPrefetcher(const LayerPrefetcher&) = delete;
  LayerPrefetcher& operator=(const LayerPrefetcher&) = delete;

  // Starts loading `tensors` of `layer`; a job in flight for another layer is finished first.
  void start(int64_t layer, std::vector<PrefetchTensor> tensors);
  bool pending(int64_t layer) const;
  // Waits for the job of `layer` (if any) and returns its tensors, ready on the current
  // stream. On CPU the map is empty: pages are resident, conversion is up to the caller.
  std::map<std::string, at::Tensor> take(int64_t layer);

 private:
  struct Job;
  std::shared_ptr<const io::Checkpoint> checkpoint_;
  at::Device device_;
  std::unique_ptr<Job> job_;
};

// Releases the resident pages of a mapped range (whole pages inside it only) so a streamed
// layer stops counting towards RSS; the data stays in the page cache and faults back in from
// the file if read again. The checkpoint mapping is never written (weights are always copied).
void drop_mapped_pages(std::span<const std::byte> bytes);

}  // namespace headwise::arch
