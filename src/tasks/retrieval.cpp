// RULER's needle-in-a-haystack family and variable tracking.
#include "headwise/core/error.hpp"
#include "text_tasks.hpp"

namespace headwise::tasks {
namespace {

// Enough haystack sentences for any length the fitter may try (about 20 tokens each).
int64_t max_sentences(int64_t length) {
  return std::max<int64_t>(8, length);
}

std::string listing(const std::vector<std::string>& items) {
  if (items.size() <= 1) return items.empty() ? "" : items[0];
  std::vector<std::string> head(items.begin(), items.end() - 1);
  return join(head, ", ") + ", and " + items.back();
}

}  // namespace

nlohmann::json make_niah(const TaskContext& ctx, int keys, int values, int queries) {
  // RULER: essay haystack, word keys, 7-digit number values, "special magic numbers".
  const auto key_list = random_keys(ctx.rng, static_cast<size_t>(keys));
  struct Needle {
    std::string key, value;
    double depth;
  };
  std::vector<Needle> needles;
  const double depth = sample_depth(ctx.index, ctx.request.samples);
  for (int k = 0; k < keys; ++k) {
    for (int v = 0; v < values; ++v) {
      // The first needle sits at this sample's depth; the others anywhere.
      const double d = needles.empty() ? depth : static_cast<double>(ctx.rng.below(1001)) / 1000.0;
      needles.push_back({key_list[static_cast<size_t>(k)], random_number(ctx.rng, 7), d});
    }
  }
  const std::vector<std::string> queried(key_list.begin(), key_list.begin() + queries);
  std::vector<std::string> answers;
  for (const auto& needle : needles) {
    if (std::find(queried.begin(), queried.end(), needle.key) != queried.end())
      answers.push_back(needle.value);
  }
  const auto start =
      static_cast<size_t>(ctx.rng.below(static_cast<int64_t>(ctx.haystack.sentences.size())));
  const std::string question = "What are all the special magic numbers for " + listing(queried) +
                               " mentioned in the provided text?";
  const auto build_prompt = [&](int64_t n) {
    std::vector<std::pair<double, std::string>> items;
    for (const auto& needle : needles) {
      items.emplace_back(needle.depth, "One of the special magic numbers for " + needle.key +
                                           " is: " + needle.value + ".");
    }
    const auto context =
        insert_at_depths(haystack_run(ctx.haystack, start, static_cast<size_t>(n)), items);
    return "Some special magic numbers are hidden within the following text. Make sure to memorize "
           "it. I will quiz "
           "you about the numbers afterwards.\n" +
           join(context, " ") + "\n" + question + " The special magic numbers for " +
           listing(queried) + " mentioned in the provided text are";
  };
  const std::string answer_text = spaced(listing(answers), ".");
  const int64_t n = fit_units(
      ctx.counter, ctx.request.length, max_sentences(ctx.request.length),
      [&](int64_t k) { return build_prompt(k) + answer_text; }, ctx.request.task);
  nlohmann::json params = {{"num_needle_k", keys},    {"num_needle_v", values},
                           {"num_needle_q", queries}, {"depth", depth},
                           {"haystack", "essay"},     {"haystack_sentences", n},
                           {"keys", key_list},        {"queried_keys", queried}};
  return make_record(ctx.request.task, build_prompt(n), answer_text, answers, std::move(params),
                     ctx.counter);
}

nlohmann::json make_variable_tracking(const TaskContext& ctx) {
  // RULER: one chain of 4 hops over the noise haystack; answer all names bound to the value.
  constexpr int kHops = 4;
  std::vector<std::string> names;
  while (names.size() < kHops + 1) {
    std::string name;
    for (int i = 0; i < 5; ++i) name.push_back(static_cast<char>('A' + ctx.rng.below(26)));
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  const std::string value = random_number(ctx.rng, 5);
  const double depth = sample_depth(ctx.index, ctx.request.samples);
  std::vector<std::pair<double, std::string>> items;
  const double first = 0.8 * depth;  // the chain starts at this sample's depth and runs on after it
  for (int h = 0; h <= kHops; ++h) {
    const std::string rhs = h == 0 ? value : "VAR " + names[static_cast<size_t>(h - 1)];
    items.emplace_back(first + (1.0 - first) * h / (kHops + 1),
                       "VAR " + names[static_cast<size_t>(h)] + " = " + rhs + ".");
  }
  const auto build_prompt = [&](int64_t n) {
    return "Memorize and track the chain(s) of variable assignment hidden in the following "
           "text.\n\n" +
           join(insert_at_depths(noise_run(static_cast<size_t>(n)), items), " ") +
           "\nQuestion: Find all variables that are assigned the value " + value +
           " in the text above. Answer: According to the chain(s) of variable assignment in the "
           "text above, " +
           std::to_string(kHops + 1) + " variables are assigned the value " + value + ", they are:";
  };
  const std::string answer_text = spaced(join(names, " "), ".");
  const int64_t n = fit_units(
      ctx.counter, ctx.request.length, max_sentences(ctx.request.length),
      [&](int64_t k) { return build_prompt(k) + answer_text; }, ctx.request.task);
  nlohmann::json params = {{"num_chains", 1},     {"num_hops", kHops},       {"depth", depth},
                           {"haystack", "noise"}, {"haystack_sentences", n}, {"value", value}};
  return make_record(ctx.request.task, build_prompt(n), answer_text, names, std::move(params),
                     ctx.counter);
}

}  // namespace headwise::tasks
