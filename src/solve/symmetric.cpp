#include "headwise/solve/symmetric.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>

#include "headwise/core/error.hpp"
#include "headwise/memory/tensor_parallel.hpp"

namespace headwise::solve {
namespace {

struct Assigned {
  double distortion = 0.0;
  int64_t bytes = 0;
  std::vector<size_t> option_of_head;  // per head of the shard: index into its group's options
};

// The least-distortion assignment of the shard's heads to the levels of `multiset` (indexes into
// the layer's common windows, ascending), exactly: DP over the subsets of levels used so far
// (k <= 20). Ties: fewer bytes, then the first found (deterministic).
Assigned assign_shard(const std::vector<const Group*>& heads,
                      const std::vector<std::vector<size_t>>& option_index,
                      const std::vector<size_t>& shard, const std::vector<size_t>& multiset) {
  const size_t k = shard.size();
  const size_t states = size_t{1} << k;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> best(states, kInf);
  std::vector<int64_t> bytes(states, 0);
  std::vector<size_t> from(states, 0), slot_of(states, 0);
  best[0] = 0.0;
  for (size_t used = 0; used < states; ++used) {
    if (best[used] == kInf) continue;
    const size_t h = static_cast<size_t>(__builtin_popcountll(used));  // next head of the shard
    if (h == k) continue;
    for (size_t s = 0; s < k; ++s) {
      if (used & (size_t{1} << s)) continue;
      // Equal levels in the multiset are interchangeable: take the first free one only.
      if (s > 0 && multiset[s] == multiset[s - 1] && !(used & (size_t{1} << (s - 1)))) continue;
      const Option& o = heads[shard[h]]->options[option_index[shard[h]][multiset[s]]];
      const size_t next = used | (size_t{1} << s);
      const double d = best[used] + o.distortion;
      const int64_t b = bytes[used] + o.bytes;
      if (d < best[next] || (d == best[next] && b < bytes[next])) {
        best[next] = d;
        bytes[next] = b;
        from[next] = used;
        slot_of[next] = s;
      }
    }
  }
  Assigned out;
  out.distortion = best[states - 1];
  out.bytes = bytes[states - 1];
  out.option_of_head.assign(k, 0);
  for (size_t used = states - 1; used != 0; used = from[used]) {
    const size_t h = static_cast<size_t>(__builtin_popcountll(used)) - 1;
    out.option_of_head[h] = option_index[shard[h]][multiset[slot_of[used]]];
  }
  return out;
}

// Every multiset of k levels out of `levels` (non-decreasing index vectors), in lexicographic
// order.
void multisets(size_t levels, size_t k, std::vector<size_t>& current,
               std::vector<std::vector<size_t>>& out, size_t limit, int64_t layer) {
  if (current.size() == k) {
    if (out.size() >= limit) {
      throw_input_error(
          "--tensor-parallel-size: layer {} has more than {} window multisets per shard; the "
          "exact symmetric solve would be too large",
          layer, limit);
    }
    out.push_back(current);
    return;
  }
  for (size_t l = current.empty() ? 0 : current.back(); l < levels; ++l) {
    current.push_back(l);
    multisets(levels, k, current, out, limit, layer);
    current.pop_back();
  }
}

struct LayerPlan {
  int64_t layer_id = 0;
  std::vector<size_t> group_index;  // the layer's input groups, by kv_head
  // per option of the composite group: per head (kv_head order) the chosen option index
  std::vector<std::vector<size_t>> choice;
};

}  // namespace

SymmetricResult solve_symmetric(const std::vector<Group>& groups, int64_t tensor_parallel_size,
                                int64_t budget, const SolveOptions& options,
                                size_t max_layer_options) {
  validate_groups(groups);
  const int64_t tp = tensor_parallel_size;
  SymmetricResult out;
  out.tensor_parallel_size = tp;
  std::map<int64_t, std::vector<size_t>> by_layer;
  for (size_t g = 0; g < groups.size(); ++g) by_layer[groups[g].layer_id].push_back(g);

  std::vector<Group> composite;
  std::vector<LayerPlan> plans;
  for (auto& [layer, members] : by_layer) {
    std::sort(members.begin(), members.end(),
              [&](size_t a, size_t b) { return groups[a].kv_head < groups[b].kv_head; });
    for (size_t i = 0; i < members.size(); ++i) {
      if (groups[members[i]].kv_head != static_cast<int64_t>(i))
        throw_input_error("layer {}: KV heads are not 0..{}", layer, members.size() - 1);
    }
    // The layer's windows: every head must offer the same ones.
    std::vector<int64_t> windows;
    for (const auto& o : groups[members.front()].options) windows.push_back(o.window);
    std::sort(windows.begin(), windows.end());
    std::vector<const Group*> heads;
    std::vector<std::vector<size_t>> option_index;  // per head: window level -> option
    for (size_t m : members) {
      const Group& g = groups[m];
      std::vector<size_t> index(windows.size(), 0);
      if (g.options.size() != windows.size())
        throw_input_error("layer {} head {}: offers other windows than head 0", layer, g.kv_head);
      for (size_t o = 0; o < g.options.size(); ++o) {
        const auto it = std::find(windows.begin(), windows.end(), g.options[o].window);
        if (it == windows.end())
          throw_input_error("layer {} head {}: offers other windows than head 0", layer, g.kv_head);
        index[static_cast<size_t>(it - windows.begin())] = o;
      }
      heads.push_back(&g);
      option_index.push_back(std::move(index));
    }
    const auto shards = memory::tensor_parallel_shards(static_cast<int64_t>(members.size()), tp);
    LayerPlan plan;
    plan.layer_id = layer;
    plan.group_index = members;
    Group layer_group;
    layer_group.layer_id = layer;
    layer_group.kv_head = 0;
    if (static_cast<int64_t>(members.size()) < tp) {
      // Replicas: one head per rank, so every head of the layer shares one window.
      for (size_t l = 0; l < windows.size(); ++l) {
        Option o;
        std::vector<size_t> choice;
        for (size_t h = 0; h < heads.size(); ++h) {
          const Option& ho = heads[h]->options[option_index[h][l]];
          o.bytes += ho.bytes;
          o.distortion += ho.distortion;
          choice.push_back(option_index[h][l]);
        }
        layer_group.options.push_back(o);
        plan.choice.push_back(std::move(choice));
      }
    } else {
      const size_t k = shards.front().size();
      if (k > 20) throw_input_error("layer {}: {} KV heads per shard (at most 20)", layer, k);
      std::vector<std::vector<size_t>> all;
      std::vector<size_t> current;
      multisets(windows.size(), k, current, all, max_layer_options, layer);
      for (const auto& ms : all) {
        Option o;
        std::vector<size_t> choice(heads.size(), 0);
        for (const auto& shard_heads : shards) {
          std::vector<size_t> shard(shard_heads.begin(), shard_heads.end());
          const Assigned a = assign_shard(heads, option_index, shard, ms);
          o.bytes += a.bytes;
          o.distortion += a.distortion;
          for (size_t i = 0; i < shard.size(); ++i) choice[shard[i]] = a.option_of_head[i];
        }
        layer_group.options.push_back(o);
        plan.choice.push_back(std::move(choice));
      }
    }
    // A synthetic window per option (the solver's ties prefer the larger): ordered by bytes,
    // so an equal-cost tie keeps the option with more bytes, as the per-head solver does.
    std::vector<size_t> order(layer_group.options.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return layer_group.options[a].bytes < layer_group.options[b].bytes;
    });
    Group sorted_group = layer_group;
    LayerPlan sorted_plan = plan;
    for (size_t i = 0; i < order.size(); ++i) {
      sorted_group.options[i] = layer_group.options[order[i]];
      sorted_group.options[i].window = static_cast<int64_t>(i) + 1;
      sorted_plan.choice[i] = plan.choice[order[i]];
    }
    out.layer_options += sorted_group.options.size();
    composite.push_back(std::move(sorted_group));
    plans.push_back(std::move(sorted_plan));
  }

  const SolveResult layer_result = solve_exact(composite, budget, options);
  SolveResult& r = out.result;
  r.choice.assign(groups.size(), 0);
  r.proven_optimal = layer_result.proven_optimal;
  for (size_t l = 0; l < plans.size(); ++l) {
    const auto& chosen = plans[l].choice[layer_result.choice[l]];
    for (size_t h = 0; h < chosen.size(); ++h) r.choice[plans[l].group_index[h]] = chosen[h];
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const Option& o = groups[g].options[r.choice[g]];
    r.total_bytes += o.bytes;
    r.total_distortion += o.distortion;
  }
  return out;
}

}  // namespace headwise::solve
