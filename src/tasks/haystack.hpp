#pragma once
// Shared pieces of the generators: the public-domain haystack, word pools, the length
// fitter and needle placement.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "headwise/core/rng.hpp"
#include "headwise/tasks/generators.hpp"

namespace headwise::tasks {

struct Haystack {
  std::vector<std::string> sentences;  // essays in file order, split into sentences
  std::vector<std::string> words;      // distinct lowercase words of the essays
};
const Haystack& load_haystack(const std::filesystem::path& dir);

// `count` consecutive haystack sentences starting at `start`, cycling through the essays.
std::vector<std::string> haystack_run(const Haystack& haystack, size_t start, size_t count);

// RULER's "noise" haystack for variable tracking.
std::vector<std::string> noise_run(size_t count);

// Distinct random keys ("adjective-noun") and a pool of distinct words for common-words.
std::vector<std::string> random_keys(Rng& rng, size_t count);
std::vector<std::string> word_pool(const Haystack& haystack, Rng& rng, size_t count);
std::vector<std::string> person_names(Rng& rng, size_t count);
// A random decimal number with exactly `digits` digits (no leading zero).
std::string random_number(Rng& rng, int digits);
const std::vector<std::string>& city_names();

// Depth of sample i of k, spread evenly over [0, 1].
double sample_depth(int64_t index, int64_t samples);

// Inserts `items` into `sentences` at fractional depths (0 = start, 1 = end), keeping the
// given order for equal depths.
std::vector<std::string> insert_at_depths(std::vector<std::string> sentences,
                                          const std::vector<std::pair<double, std::string>>& items);

std::string join(const std::vector<std::string>& parts, const std::string& separator);
// " " + text + suffix, written without `const char* + std::string&&`, for which GCC 12
// emits a false -Wstringop-overflow warning.
std::string spaced(const std::string& text, const std::string& suffix = "");

// Largest n in [1, max_units] with counter.count(build(n)) <= length; throws InputError
// naming the task when even n = 1 is too long.
int64_t fit_units(const TokenCounter& counter, int64_t length, int64_t max_units,
                  const std::function<std::string(int64_t)>& build, const std::string& task);

// The common record shape: text = prompt + answer, so calibration sees the retrieval.
nlohmann::json make_record(const std::string& task, const std::string& prompt,
                           const std::string& answer_text, const std::vector<std::string>& answers,
                           nlohmann::json params, const TokenCounter& counter);

}  // namespace headwise::tasks
