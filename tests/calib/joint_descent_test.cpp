// greedy_joint_descent, the search inside one global layer of the answer measures, on instances
// built by hand: the assignment it must reach is derived here step by step (the rule: cut the
// move with the least measure added per byte saved until the layer fits; with a price, go on
// cutting below it; then lengthen while a lengthening removes more than the price per byte), or
// found by brute force over every assignment.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "calib/walk/joint_descent.hpp"
#include "headwise/core/error.hpp"

using namespace headwise;
using calib::greedy_joint_descent;
using Assignment = std::vector<size_t>;

namespace {

// One head with `bytes[l]` and `distortion[l]` per level, levels in increasing bytes.
solve::Group head(const std::vector<int64_t>& bytes, const std::vector<double>& distortion) {
  solve::Group g;
  for (size_t l = 0; l < bytes.size(); ++l)
    g.options.push_back({static_cast<int64_t>(l), bytes[l], distortion[l]});
  return g;
}

// The measure of heads that do not interact: the sum of each head's own distortion.
double additive(const std::vector<solve::Group>& groups, const Assignment& assign) {
  double sum = 0;
  for (size_t h = 0; h < groups.size(); ++h) sum += groups[h].options[assign[h]].distortion;
  return sum;
}

// Every assignment of `groups`, in lexicographic order.
std::vector<Assignment> every_assignment(const std::vector<solve::Group>& groups) {
  std::vector<Assignment> out{Assignment(groups.size(), 0)};
  for (size_t h = 0; h < groups.size(); ++h) {
    std::vector<Assignment> next;
    for (const Assignment& a : out) {
      for (size_t l = 0; l < groups[h].options.size(); ++l) {
        next.push_back(a);
        next.back()[h] = l;
      }
    }
    out = std::move(next);
  }
  return out;
}

// The assignment with the least `objective` among those within `allowance` (brute force).
Assignment brute_force_best(const std::vector<solve::Group>& groups, int64_t allowance,
                            const std::function<double(const Assignment&)>& objective) {
  Assignment best;
  double best_value = std::numeric_limits<double>::infinity();
  for (const Assignment& a : every_assignment(groups)) {
    if (calib::layer_bytes(groups, a) > allowance) continue;
    const double value = objective(a);
    if (value < best_value) {
      best_value = value;
      best = a;
    }
  }
  return best;
}

}  // namespace

TEST_CASE("joint descent: cuts the cheapest move per byte until the layer fits", "[calib]") {
  // Head 0: 0.5 / 0.2 / 0 at 1 / 2 / 4 bytes; head 1: 0.3 / 0.1 / 0. From (2, 2) at 8 bytes
  // over an allowance of 5, the cuts added per byte saved are: head 0 to level 1 0.2/2 = 0.1, to
  // level 0 0.5/3; head 1 to level 1 0.1/2 = 0.05, to level 0 0.3/3 = 0.1. Head 1 goes to level 1
  // (6 bytes, still over). Then head 0 to level 1 0.1, to level 0 0.5/3, head 1 to level 0
  // 0.2/1: head 0 goes to level 1 (4 bytes). Lengthening either head needs 6 bytes: none fits.
  const std::vector<solve::Group> groups{head({1, 2, 4}, {0.5, 0.2, 0.0}),
                                         head({1, 2, 4}, {0.3, 0.1, 0.0})};
  const auto measure = [&](const Assignment& a) { return additive(groups, a); };
  CHECK(greedy_joint_descent(groups, 5, measure, -1.0) == Assignment{1, 1});
  // Room for everything: nothing is cut.
  CHECK(greedy_joint_descent(groups, 8, measure, -1.0) == Assignment{2, 2});
  // Room for the smallest levels only: both cut to level 0.
  CHECK(greedy_joint_descent(groups, 2, measure, -1.0) == Assignment{0, 0});
  // Below the smallest levels there is nothing left to cut: an internal error, not a result.
  CHECK_THROWS_AS(greedy_joint_descent(groups, 1, measure, -1.0), Error);
}

TEST_CASE("joint descent sees heads that back each other up, as a per-head sum cannot", "[calib]") {
  // Three heads, short (1 byte) or full (10 bytes). The answer survives while any head is full
  // (each short head then costs 0.01) and is lost (1.0) when every head is short: the heads of a
  // layer back each other up.
  const std::vector<solve::Group> groups{head({1, 10}, {0.01, 0.0}), head({1, 10}, {0.01, 0.0}),
                                         head({1, 10}, {0.01, 0.0})};
  const auto joint = [](const Assignment& a) {
    int64_t short_heads = 0;
    for (size_t l : a) short_heads += l == 0 ? 1 : 0;
    return short_heads == static_cast<int64_t>(a.size()) ? 1.0 : 0.01 * short_heads;
  };
  // 12 bytes hold one full head and two short ones. Cutting head 0 then head 1 (equal cost per
  // byte: the lower head first) reaches it; the brute-force optimum has the same value.
  const Assignment found = greedy_joint_descent(groups, 12, joint, -1.0);
  CHECK(found == Assignment{0, 0, 1});
  CHECK(joint(found) == joint(brute_force_best(groups, 12, joint)));
  // The per-head sum would cut any head alone for 0.01, so it prices all three short at 0.03;
  // the joint measure charges 1.0 for that, and keeps a full head while the bytes allow it.
  CHECK(additive(groups, {0, 0, 0}) == Approx(0.03));
  CHECK(joint({0, 0, 0}) == 1.0);
  // 3 bytes: every head must be short, whatever it costs.
  CHECK(greedy_joint_descent(groups, 3, joint, -1.0) == Assignment{0, 0, 0});
}

TEST_CASE("joint descent with a price equals the Lagrangian argmin on convex per-head curves",
          "[calib]") {
  // Heads that do not interact, with convex curves (distortion falls by less per byte at every
  // longer level): cutting while a cut adds less than the price per byte, then lengthening while
  // one removes more, stops where each head minimises distortion + price x bytes. The brute
  // force below finds that minimum over every assignment.
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    INFO("trial " << trial);
    std::vector<solve::Group> groups;
    const size_t heads = 1 + trial % 4;
    for (size_t h = 0; h < heads; ++h) {
      // Bytes grow by a random step; the distortion's decrease per byte shrinks level by level.
      std::vector<int64_t> bytes{1 + static_cast<int64_t>(unit(rng) * 4)};
      std::vector<double> slopes;
      for (int l = 1; l < 4; ++l) {
        bytes.push_back(bytes.back() + 1 + static_cast<int64_t>(unit(rng) * 8));
        slopes.push_back(unit(rng));
      }
      std::sort(slopes.rbegin(), slopes.rend());
      std::vector<double> distortion(4, 0.0);
      for (int l = 2; l >= 0; --l) {
        distortion[static_cast<size_t>(l)] =
            distortion[static_cast<size_t>(l) + 1] +
            slopes[static_cast<size_t>(l)] * static_cast<double>(bytes[static_cast<size_t>(l) + 1] -
                                                                 bytes[static_cast<size_t>(l)]);
      }
      groups.push_back(head(bytes, distortion));
    }
    const double price = unit(rng);
    const auto measure = [&](const Assignment& a) { return additive(groups, a); };
    const int64_t room = std::numeric_limits<int64_t>::max() / 4;  // the allowance never binds
    const Assignment expected = brute_force_best(groups, room, [&](const Assignment& a) {
      return additive(groups, a) + price * static_cast<double>(calib::layer_bytes(groups, a));
    });
    CHECK(greedy_joint_descent(groups, room, measure, price) == expected);
  }
}

TEST_CASE("joint descent: ties go to more bytes moved, then the lower head and level", "[calib]") {
  // Head 0 saves 2 bytes for 0.5, head 1 saves 4 bytes for 1.0: 0.25 per byte both (exact in
  // binary). With 6 bytes allowed either cut fits; the larger one is taken, and lengthening head
  // 1 back would need 8 bytes.
  const std::vector<solve::Group> unequal{head({1, 3}, {0.5, 0.0}), head({1, 5}, {1.0, 0.0})};
  const auto measure_unequal = [&](const Assignment& a) { return additive(unequal, a); };
  CHECK(greedy_joint_descent(unequal, 6, measure_unequal, -1.0) == Assignment{1, 0});
  // Two identical heads, one cut needed: the lower head gives way.
  const std::vector<solve::Group> two{head({1, 4}, {0.5, 0.0}), head({1, 4}, {0.5, 0.0})};
  const auto measure_two = [&](const Assignment& a) { return additive(two, a); };
  CHECK(greedy_joint_descent(two, 5, measure_two, -1.0) == Assignment{0, 1});
}

TEST_CASE("joint descent lengthens back what a forced cut over-saved", "[calib]") {
  // Head 0: 0.6 at 1 byte, 0.5 at 5, 0 at 9; head 1: 0.2 at 1 byte, 0 at 9. From 18 bytes, per
  // byte saved: head 0 to level 1 costs 0.5/4 = 0.125, to level 0 0.6/8 = 0.075; head 1 to
  // level 0 0.2/8 = 0.025, the cheapest. With 10 (or 14) bytes allowed that cut fits, and head
  // 1 back at full would need 18: (2, 0).
  const std::vector<solve::Group> groups{head({1, 5, 9}, {0.6, 0.5, 0.0}),
                                         head({1, 9}, {0.2, 0.0})};
  const auto measure = [&](const Assignment& a) { return additive(groups, a); };
  CHECK(greedy_joint_descent(groups, 10, measure, -1.0) == Assignment{2, 0});
  CHECK(greedy_joint_descent(groups, 14, measure, -1.0) == Assignment{2, 0});
  // 6 bytes allowed: after head 1's cut (10 bytes, still over), head 0's cheapest cut per byte
  // is to level 0 (0.075 against 0.125), 2 bytes: 4 more than needed. Lengthening head 0 back
  // to level 1 (6 bytes) removes 0.1 for 4 bytes; head 1 at full would need 10. So (1, 0),
  // which the brute force confirms is the best within 6 bytes.
  CHECK(greedy_joint_descent(groups, 6, measure, -1.0) == Assignment{1, 0});
  CHECK(measure({1, 0}) == Approx(0.7));
  CHECK(measure(brute_force_best(groups, 6, measure)) == Approx(0.7));
}

TEST_CASE("joint descent prefetches every assignment it prices, before pricing them", "[calib]") {
  const std::vector<solve::Group> groups{
      head({1, 2, 4}, {0.5, 0.2, 0.0}), head({1, 2, 4}, {0.3, 0.1, 0.0}), head({1, 3}, {0.4, 0.0})};
  std::set<Assignment> prefetched;
  int64_t priced = 0, priced_unannounced = 0;
  const auto measure = [&](const Assignment& a) {
    ++priced;
    if (!prefetched.count(a)) ++priced_unannounced;
    return additive(groups, a);
  };
  const auto prefetch = [&](const std::vector<Assignment>& step) {
    prefetched.clear();  // a step announces its own candidates
    prefetched.insert(step.begin(), step.end());
  };
  const Assignment with = greedy_joint_descent(groups, 6, measure, 0.05, prefetch);
  CHECK(priced > 0);
  CHECK(priced_unannounced == 0);
  // Announcing changes nothing about the result.
  CHECK(with == greedy_joint_descent(groups, 6, measure, 0.05));
}
