// ExactSum is what lets ranks merge their sums in any order and still match one process: the
// result must depend on the multiset of terms only, and be the correctly rounded exact sum.
#include <ATen/Parallel.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "headwise/core/exact_sum.hpp"
#include "headwise/core/reproducible_math.hpp"

using headwise::ExactSum;

namespace {

double exact_sum_of(const std::vector<double>& values) {
  ExactSum s;
  for (double v : values) s.add(v);
  return s.value();
}

}  // namespace

TEST_CASE("ExactSum is exact where a plain fp64 sum is not", "[core]") {
  CHECK(exact_sum_of({1e300, 1.0, -1e300}) == 1.0);  // a plain sum gives 0
  CHECK(exact_sum_of({0.1, 0.2, -0.3}) ==
        std::ldexp(1.0, -55));  // exactly; a plain sum gives 2^-54
  // Ten times the double nearest 0.1 is 1 + 2^-54 + ..., which rounds to 1 (a plain sum: 1 -
  // 2^-53).
  CHECK(exact_sum_of(std::vector<double>(10, 0.1)) == 1.0);
  // Subnormals and the largest finite values at once.
  const double tiny = std::numeric_limits<double>::denorm_min(),
               huge = std::numeric_limits<double>::max();
  CHECK(exact_sum_of({huge, tiny, -huge}) == tiny);
  CHECK(exact_sum_of({tiny, tiny, tiny}) == 3 * tiny);
  CHECK(exact_sum_of({-2.5, 0.5}) == -2.0);
  CHECK(exact_sum_of({}) == 0.0);
}

TEST_CASE("ExactSum rounds ties to even", "[core]") {
  // 1 + 2^-53 lies exactly between 1 and 1 + 2^-52: the even neighbour is 1.
  CHECK(exact_sum_of({1.0, std::ldexp(1.0, -53)}) == 1.0);
  // 1 + 3 * 2^-53 lies between 1 + 2^-52 and 1 + 2^-51: the even one is 1 + 2^-51.
  CHECK(exact_sum_of({1.0, std::ldexp(3.0, -53)}) == 1.0 + std::ldexp(1.0, -51));
  // Just above the tie (a sticky bit far below) rounds up.
  CHECK(exact_sum_of({1.0, std::ldexp(1.0, -53), std::ldexp(1.0, -200)}) ==
        1.0 + std::ldexp(1.0, -52));
}

TEST_CASE("ExactSum does not depend on the order or the split of its terms", "[core]") {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-60, 60);
  std::vector<double> values;
  for (int i = 0; i < 2000; ++i) values.push_back(std::ldexp(mantissa(rng), exponent(rng)));
  const double reference = exact_sum_of(values);

  double plain = 0.0;
  for (double v : values) plain += v;
  std::vector<double> shuffled = values;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  double plain_shuffled = 0.0;
  for (double v : shuffled) plain_shuffled += v;
  CHECK(plain != plain_shuffled);  // the plain sum does depend on the order (the test can fail)

  CHECK(exact_sum_of(shuffled) == reference);
  // Split into three "ranks", merged in another order, through their byte images.
  ExactSum parts[3];
  for (size_t i = 0; i < shuffled.size(); ++i) parts[i % 3].add(shuffled[i]);
  ExactSum merged;
  for (int r : {2, 0, 1}) merged.merge(ExactSum::from_bytes(parts[r].to_bytes()));
  CHECK(merged.value() == reference);
  CHECK(merged.to_bytes() == [&] {
    ExactSum s;
    for (double v : values) s.add(v);
    return s.to_bytes();
  }());
}

TEST_CASE("ExactSum carries NaN and infinities like a plain sum", "[core]") {
  ExactSum s;
  s.add(1.0);
  s.add(std::numeric_limits<double>::infinity());
  CHECK(s.value() == std::numeric_limits<double>::infinity());
  s.add(-std::numeric_limits<double>::infinity());
  CHECK(std::isnan(s.value()));
  ExactSum n;
  n.add(std::numeric_limits<double>::quiet_NaN());
  CHECK(std::isnan(ExactSum::from_bytes(n.to_bytes()).value()));
  CHECK_THROWS(ExactSum::from_bytes("short"));
}

namespace {

// Sets the intra-op thread count for one scope (the suite runs at one thread).
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int n) : saved_(at::get_num_threads()) { at::set_num_threads(n); }
  ~IntraOpThreads() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

}  // namespace

TEST_CASE("a tensor's sum and a small product give the same bits at any intra-op thread count",
          "[core]") {
  // ATen reduces a large tensor to one value with a partial sum per thread, and MKL splits a
  // small product's work by thread: both give other last bits at other thread counts. The
  // library's forms must not (core/reproducible_math.hpp).
  at::manual_seed(3);
  const at::Tensor big = at::randn({3, 4096, 128}, at::kDouble);
  const at::Tensor x = at::randn({16, 64}), w = at::randn({64, 64});
  at::Tensor sum_one, plain_sum_one, product_one;
  {
    const IntraOpThreads one(1);
    sum_one = headwise::thread_count_independent_sum(big.pow(2));
    plain_sum_one = big.pow(2).sum();
    const headwise::SmallGemmOnOneThread pinned(16, 64, true);
    product_one = at::linear(x, w);
  }
  int plain_sums_differing = 0, plain_products_differing = 0;
  for (int threads : {2, 3, 6, 8, 16}) {
    INFO(threads << " threads");
    const IntraOpThreads n(threads);
    CHECK(at::equal(headwise::thread_count_independent_sum(big.pow(2)), sum_one));
    {
      const headwise::SmallGemmOnOneThread pinned(16, 64, true);
      CHECK(at::equal(at::linear(x, w), product_one));
    }
    plain_sums_differing += at::equal(big.pow(2).sum(), plain_sum_one) ? 0 : 1;
    plain_products_differing += at::equal(at::linear(x, w), product_one) ? 0 : 1;
  }
  // What the forms guard against, where this CPU shows it (measured on the 2-core machine: 2 of 5
  // and 3 of 5).
  WARN("plain sum differs at " << plain_sums_differing << " of 5 thread counts, plain product at "
                               << plain_products_differing);
  // The blocked sum is the sum: within float64 rounding of the exact value.
  CHECK(headwise::thread_count_independent_sum(big.pow(2)).item<double>() ==
        Approx(big.pow(2).sum().item<double>()).epsilon(1e-12));
  CHECK(headwise::thread_count_independent_sum(at::ones({5})).item<double>() == 5.0);
  CHECK(headwise::thread_count_independent_sum(at::ones({4096 * 3 + 7}), at::kDouble)
            .item<double>() == 4096.0 * 3 + 7);
}
