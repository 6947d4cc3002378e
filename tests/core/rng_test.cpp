// Rng's outputs are pinned: calibration data, task samples and the random baseline are made from
// them, and committed files (calib-data/, policies/) must come out byte-identical on any platform.
// The expected values are those of the calibration generators' former Rng (rejection sampling
// over std::mt19937_64), which this one replaced.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "headwise/core/error.hpp"
#include "headwise/core/rng.hpp"

using headwise::Rng;

TEST_CASE("Rng gives the same sequence on every platform", "[core]") {
  Rng rng(42);
  std::vector<int64_t> below;
  for (int i = 0; i < 4; ++i) below.push_back(rng.below(10));
  CHECK(below == std::vector<int64_t>{6, 4, 0, 2});
  std::vector<int64_t> between;
  for (int i = 0; i < 3; ++i) between.push_back(rng.between(1780, 1990));
  CHECK(between == std::vector<int64_t>{1836, 1857, 1874});
  CHECK(rng.below_unsigned(UINT64_MAX) == 6878563960102566144ull);
  std::vector<int> order{0, 1, 2, 3, 4, 5, 6, 7};
  rng.shuffle(order);
  CHECK(order == std::vector<int>{7, 4, 5, 0, 2, 1, 3, 6});
  CHECK(rng.pick(std::vector<std::string>{"amber", "bold", "calm"}) == "calm");
  CHECK(rng.unit() == 0.7532185104972261);
  CHECK(Rng(7).next() == 13915952638675311015ull);  // std::mt19937_64's own output
}

TEST_CASE("Rng refuses an empty range", "[core]") {
  Rng rng(0);
  CHECK_THROWS_AS(rng.below(0), headwise::Error);
  CHECK_THROWS_AS(rng.below(-3), headwise::Error);
  CHECK_THROWS_AS(rng.below_unsigned(0), headwise::Error);
}
