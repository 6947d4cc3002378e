// The built-in synthetic retrieval set (calibration's default data, eval's token tasks).
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "headwise/tasks/synthetic.hpp"

using namespace headwise;

TEST_CASE("the built-in set's answer positions predict the queried values", "[tasks]") {
  const tasks::SyntheticOptions o{512, 3, 1024, 7};
  const auto seqs = tasks::synthetic_retrieval_set(o);
  const auto positions = tasks::synthetic_answer_positions(o);
  REQUIRE(positions.size() == 2 * 3);  // 1024 tokens: 2 needles, 3 value tokens each
  for (const auto& seq : seqs) {
    for (size_t q = 0; q < positions.size(); q += 3) {
      const auto sep = static_cast<size_t>(positions[q]);
      CHECK(seq[sep] == 65);      // the separator (vocabulary 512: marker 64, separator 65)
      CHECK(seq[sep - 3] == 64);  // the query's marker
      CHECK(positions[q + 2] == positions[q] + 2);
      // The value that follows was planted earlier, after the same key.
      const std::vector<int64_t> needle(seq.begin() + static_cast<std::ptrdiff_t>(sep - 3),
                                        seq.begin() + static_cast<std::ptrdiff_t>(sep + 4));
      const auto first = std::search(seq.begin(), seq.end(), needle.begin(), needle.end());
      CHECK(first - seq.begin() < static_cast<std::ptrdiff_t>(sep) - 3);
    }
  }
}
