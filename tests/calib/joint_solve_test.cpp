// The joint keep-rule solve (joint_rules.hpp, step 2): one exact solve over every layer's Pareto
// frontier of assignments, selecting or not, gives the optimum of solving every set of selecting
// layers one by one (the enumeration kept for --prefill-peak), and has no limit on the global
// layers.
#include <catch2/catch.hpp>

#include <random>

#include "calib/rules/joint_rules.hpp"
#include "headwise/memory/memory_model.hpp"
#include "toy_model.hpp"

using namespace headwise;
using policy::KeepRule;

namespace {

constexpr int64_t kContext = 160;
const std::vector<int64_t> kLevels{8, 40, 64, kFullWindow};

// A head's options as the measure gives them: every window level, and each selecting rule at the
// levels that evict (below the context); divergences random, so the optimum is unique.
std::vector<calib::joint::HeadOption> random_head(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> value(0.0, 1.0);
  std::vector<calib::joint::HeadOption> out;
  for (int64_t level : kLevels) out.push_back({KeepRule::kWindow, level, value(rng)});
  for (KeepRule rule : {KeepRule::kH2O, KeepRule::kSnap}) {
    for (int64_t level : {int64_t{8}, int64_t{40}, int64_t{64}})
      out.push_back({rule, level, value(rng)});
  }
  return out;
}

struct Instance {
  arch::ModelSpec spec;
  std::vector<calib::joint::LayerOptions> layers;
  std::map<int64_t, std::vector<int64_t>> walk;
};

Instance random_instance(std::mt19937_64& rng, size_t global_layers, size_t max_heads) {
  std::uniform_int_distribution<size_t> heads(1, max_heads);
  std::uniform_int_distribution<size_t> level(0, kLevels.size() - 1);
  std::vector<std::vector<test::ToyHead>> shape;
  for (size_t l = 0; l < global_layers; ++l)
    shape.emplace_back(heads(rng), test::ToyHead{test::HeadRole::kUniform});
  Instance out{test::toy_spec(shape), {}, {}};
  for (size_t l = 0; l < global_layers; ++l) {
    calib::joint::LayerOptions layer;
    layer.layer = static_cast<int64_t>(l);
    for (size_t h = 0; h < shape[l].size(); ++h) {
      layer.heads.push_back(random_head(rng));
      out.walk[layer.layer].push_back(kLevels[level(rng)]);
    }
    out.layers.push_back(std::move(layer));
  }
  return out;
}

double summed_divergence(const Instance& instance, const calib::joint::Decision& d) {
  double total = 0.0;
  for (size_t l = 0; l < instance.layers.size(); ++l) {
    for (size_t h = 0; h < d.option[l].size(); ++h)
      total += instance.layers[l].heads[h][d.option[l][h]].divergence;
  }
  return total;
}

}  // namespace

TEST_CASE("joint solve: the layers' frontiers give the optimum of every set of selecting layers",
          "[calib][keep-rules]") {
  std::mt19937_64 rng(20261206);
  const auto memory = test::toy_memory_options(kContext);
  int compared = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const size_t global_layers = 1 + static_cast<size_t>(trial % 5);
    const Instance instance = random_instance(rng, global_layers, 3);
    // Some layers kept at the walk's windows, as the repair leaves them.
    std::set<int64_t> kept;
    for (const auto& layer : instance.layers) {
      if (std::bernoulli_distribution(0.2)(rng)) kept.insert(layer.layer);
    }
    // Budgets from the least that fits to just below every head at full (the kept at the walk's):
    // at full KV's bytes the rule of the next case decides.
    const int64_t least = [&] {
      std::map<int64_t, std::vector<int64_t>> smallest;
      for (const auto& layer : instance.layers) {
        smallest[layer.layer] = kept.contains(layer.layer)
                                    ? instance.walk.at(layer.layer)
                                    : std::vector<int64_t>(layer.heads.size(), kLevels.front());
      }
      return memory::estimate(instance.spec, smallest, memory).total_bytes;
    }();
    const int64_t most = [&] {
      auto full = memory::uniform_windows(instance.spec, kFullWindow);
      for (int64_t layer : kept) full[layer] = instance.walk.at(layer);
      return memory::estimate(instance.spec, full, memory).total_bytes;
    }();
    if (least >= most) continue;
    const int64_t budget = std::uniform_int_distribution<int64_t>(least, most - 1)(rng) -
                           memory::fixed_bytes(instance.spec, memory);
    const auto frontiers =
        calib::joint::solve(instance.spec, instance.layers, budget, memory, instance.walk, kept);
    const auto every_set = calib::joint::solve_by_selecting_sets(
        instance.spec, instance.layers, budget, memory, instance.walk, kept);
    CAPTURE(trial, global_layers, budget);
    CHECK(summed_divergence(instance, frontiers) ==
          Approx(summed_divergence(instance, every_set)).epsilon(1e-12));
    CHECK(frontiers.option == every_set.option);
    CHECK(calib::joint::decision_bytes(instance.spec, frontiers, memory) -
              memory::fixed_bytes(instance.spec, memory) <=
          budget);
    for (int64_t layer : kept) {
      CHECK(frontiers.windows.at(layer) == instance.walk.at(layer));
      CHECK_FALSE(calib::joint::selecting_layers(frontiers).contains(layer));
    }
    ++compared;
  }
  CHECK(compared >= 50);
}

TEST_CASE("joint solve: 18 global layers of 8 heads, beyond what the enumeration could try",
          "[calib][keep-rules]") {
  std::mt19937_64 rng(7);
  const auto memory = test::toy_memory_options(kContext);
  const Instance instance = random_instance(rng, 18, 8);
  const int64_t walk_bytes = memory::estimate(instance.spec, instance.walk, memory).total_bytes -
                             memory::fixed_bytes(instance.spec, memory);
  const auto d =
      calib::joint::solve(instance.spec, instance.layers, walk_bytes, memory, instance.walk, {});
  CHECK(calib::joint::decision_bytes(instance.spec, d, memory) -
            memory::fixed_bytes(instance.spec, memory) <=
        walk_bytes);
  // The walk's windows are one of the choices at these bytes: the solve is at least as good.
  double at_walk = 0.0;
  for (size_t l = 0; l < instance.layers.size(); ++l) {
    for (size_t h = 0; h < instance.layers[l].heads.size(); ++h) {
      for (const auto& option : instance.layers[l].heads[h]) {
        if (option.rule == KeepRule::kWindow &&
            option.level == instance.walk.at(static_cast<int64_t>(l))[h])
          at_walk += option.divergence;
      }
    }
  }
  CHECK(summed_divergence(instance, d) <= at_walk);
  // Under a peak bound the enumeration is refused past its limit rather than tried.
  CHECK_THROWS(calib::joint::solve_by_selecting_sets(instance.spec, instance.layers, walk_bytes,
                                                     memory, instance.walk, {}));
}

TEST_CASE("joint solve: where full KV fits, every head keeps its full window",
          "[calib][keep-rules]") {
  std::mt19937_64 rng(3);
  const auto memory = test::toy_memory_options(kContext);
  const Instance instance = random_instance(rng, 4, 3);
  const auto full = memory::uniform_windows(instance.spec, kFullWindow);
  const int64_t budget = memory::estimate(instance.spec, full, memory).total_bytes -
                         memory::fixed_bytes(instance.spec, memory);
  // Random divergences: full is rarely a head's least, so only the rule gives it.
  const auto d =
      calib::joint::solve(instance.spec, instance.layers, budget, memory, instance.walk, {});
  CHECK(d.windows == std::map<int64_t, std::vector<int64_t>>(full.begin(), full.end()));
  CHECK(calib::joint::selecting_layers(d).empty());
  // The enumeration takes here a set of selecting layers whose heads measured below full: a
  // selecting layer pays bookkeeping, so its every-head-full does not fit and its own solve
  // searched. Full KV is what the walk's solver gives when it fits.
  const auto every_set = calib::joint::solve_by_selecting_sets(instance.spec, instance.layers,
                                                               budget, memory, instance.walk, {});
  CHECK_FALSE(calib::joint::selecting_layers(every_set).empty());
}
