#include "headwise/memory/pipeline_parallel.hpp"

#include <algorithm>

#include "checked.hpp"
#include "headwise/core/error.hpp"

namespace headwise::memory {

std::vector<std::pair<int64_t, int64_t>> pipeline_layer_ranges(int64_t num_layers,
                                                               int64_t pipeline_parallel_size) {
  const int64_t pp = pipeline_parallel_size;
  if (pp < 1) throw_input_error("--pipeline-parallel-size: must be positive, got {}", pp);
  if (num_layers < pp) {
    throw_input_error(
        "--pipeline-parallel-size {}: the model has {} decoder layers, fewer than the stages", pp,
        num_layers);
  }
  std::vector<int64_t> sizes(static_cast<size_t>(pp), num_layers / pp);
  // The remainder goes one each to the stages before the last, from the second-last back.
  for (int64_t i = 2; i < num_layers % pp + 2; ++i) ++sizes[static_cast<size_t>(pp - i)];
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t start = 0;
  for (int64_t size : sizes) {
    out.emplace_back(start, start + size);
    start += size;
  }
  return out;
}

std::vector<VllmStage> vllm_stages(const VllmEstimate& e, int64_t pipeline_parallel_size) {
  const auto ranges =
      pipeline_layer_ranges(static_cast<int64_t>(e.layers.size()), pipeline_parallel_size);
  const int64_t batch = e.options.batch;
  // One group (UniformTypeKVCacheSpecs): each layer keeps its own page, every page the same
  // number of blocks; several groups share one page size.
  const bool uniform = e.groups.size() == 1 && e.groups.front().padding_slots == 0;
  std::vector<VllmStage> out;
  for (const auto& [first, end] : ranges) {
    VllmStage st;
    st.first_layer = first;
    st.end_layer = end;
    int64_t block_bytes = 0;  // one block across the stage's slots
    for (const auto& group : e.groups) {
      int64_t here = 0, here_bytes = 0, group_blocks = 0;
      for (int64_t i : group.specs) {
        const VllmSpec& s = e.specs[static_cast<size_t>(i)];
        group_blocks = std::max(group_blocks, s.pages_per_request);
        if (s.layer_id < first || s.layer_id >= end) continue;
        ++here;
        here_bytes = checked_add(here_bytes, s.page_bytes);
        st.own_bytes = checked_add(
            st.own_bytes, checked_mul(batch, checked_mul(s.pages_per_request, s.page_bytes)));
      }
      st.specs += here;
      st.slots = std::max(st.slots, here);
      block_bytes = std::max(block_bytes, here_bytes);
      st.blocks = checked_add(st.blocks, group_blocks);
    }
    if (uniform) {
      // The projected group keeps only the stage's layers: its blocks are theirs.
      st.blocks = 0;
      for (int64_t i : e.groups.front().specs) {
        const VllmSpec& s = e.specs[static_cast<size_t>(i)];
        if (s.layer_id >= first && s.layer_id < end)
          st.blocks = std::max(st.blocks, s.pages_per_request);
      }
    }
    st.total_bytes = checked_mul(batch, checked_mul(block_bytes, st.blocks));
    out.push_back(st);
  }
  return out;
}

}  // namespace headwise::memory
