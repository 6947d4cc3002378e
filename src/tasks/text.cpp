// RULER's common-words extraction and QA with distractor documents.
#include "headwise/core/error.hpp"
#include "text_tasks.hpp"

namespace headwise::tasks {

nlohmann::json make_common_words(const TaskContext& ctx) {
  // RULER cwe: 10 common words appear 30 times each, every other word 3 times; the
  // list length (number of uncommon words) is what the fitter adjusts. Below 4K tokens
  // 300 common occurrences alone would not fit, so frequencies drop to 4 and 1.
  constexpr int kCommon = 10;
  const bool short_context = ctx.request.length < 4096;
  const int kCommonFreq = short_context ? 4 : 30, kRareFreq = short_context ? 1 : 3;
  // Each entry "123. word " is at least ~3 tokens, so length / 3 words is always enough.
  const int64_t max_rare = std::max<int64_t>(1, ctx.request.length / 3);
  const auto pool = word_pool(ctx.haystack, ctx.rng, static_cast<size_t>(kCommon + max_rare));
  const std::vector<std::string> common(pool.begin(), pool.begin() + kCommon);
  // One fixed permutation of all occurrences, so a shorter list is a sub-list of a longer one.
  std::vector<std::pair<int64_t, uint64_t>> order;  // (word index, random key)
  for (int64_t w = 0; w < kCommon + max_rare; ++w) {
    for (int r = 0; r < (w < kCommon ? kCommonFreq : kRareFreq); ++r)
      order.emplace_back(w, ctx.rng.below_unsigned(UINT64_MAX));
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.second < b.second; });
  const auto build_prompt = [&](int64_t rare) {
    std::string list;
    int64_t number = 0;
    for (const auto& [w, key] : order) {
      if (w >= kCommon + rare) continue;
      list += std::to_string(++number) + ". " + pool[static_cast<size_t>(w)] + " ";
    }
    return "Below is a numbered list of words. In these words, some appear more often than others. "
           "Memorize the "
           "ones that appear most often.\n" +
           list +
           "\nQuestion: What are the 10 most common words in the above "
           "list? Answer: The top 10 words that appear most often in the list are:";
  };
  std::string answer_text;
  for (size_t i = 0; i < common.size(); ++i)
    answer_text += spaced(std::to_string(i + 1), ". " + common[i]);
  const int64_t rare = fit_units(
      ctx.counter, ctx.request.length, max_rare,
      [&](int64_t k) { return build_prompt(k) + answer_text; }, ctx.request.task);
  nlohmann::json params = {
      {"num_cw", kCommon}, {"freq_cw", kCommonFreq}, {"freq_ucw", kRareFreq}, {"num_ucw", rare}};
  return make_record(ctx.request.task, build_prompt(rare), answer_text, common, std::move(params),
                     ctx.counter);
}

namespace {

struct Fact {
  std::string statement, question, answer;
};

// Facts of one kind about different people: the distractors look like the gold fact.
Fact make_fact(int kind, const std::string& person, Rng& rng) {
  static const std::vector<std::string> orgs = {"Society of Cartographers", "Harbour Rowing Club",
                                                "Museum of Clocks",         "Glassworks Guild",
                                                "Valley Orchestra",         "Botanical Trust"};
  static const std::vector<std::string> titles = {"The Quiet Harbour",      "Salt and Iron",
                                                  "A Winter Orchard",       "The Lantern Road",
                                                  "Letters from the Ridge", "Seven Bridges"};
  const auto& city = rng.pick(city_names());
  switch (kind) {
    case 0: {
      const std::string org = rng.pick(orgs), year = std::to_string(rng.between(1780, 1990));
      return {person + " founded the " + org + " of " + city + " in " + year + ".",
              "In which year did " + person + " found the " + org + " of " + city + "?", year};
    }
    case 1: {
      const std::string title = rng.pick(titles);
      return {
          "The first novel by " + person + ", titled " + title + ", was printed in " + city + ".",
          "What is the title of the first novel by " + person + "?", title};
    }
    default: {
      const std::string bridge = std::to_string(rng.between(3, 19));
      return {"The old stone bridge at " + city + " was rebuilt by " + person + " with " + bridge +
                  " arches.",
              "How many arches did " + person + " give the old stone bridge at " + city + "?",
              bridge};
    }
  }
}

}  // namespace

nlohmann::json make_qa_distractors(const TaskContext& ctx) {
  // RULER qa: documents "Document i:", one holds the answer, the rest are distractors of
  // the same kind of fact about other people; the gold document sits at this sample's depth.
  const int kind = static_cast<int>(ctx.rng.below(3));
  const int64_t max_docs = std::max<int64_t>(2, ctx.request.length / 40);
  const auto people = person_names(ctx.rng, static_cast<size_t>(std::min<int64_t>(max_docs, 600)));
  std::vector<std::string> documents;
  Fact gold;
  for (int64_t d = 0; d < max_docs; ++d) {
    // The gold person never reappears in a distractor, so the answer is unique.
    const auto& person =
        d == 0 ? people[0] : people[1 + static_cast<size_t>(d - 1) % (people.size() - 1)];
    Fact fact = make_fact(kind, person, ctx.rng);
    if (d == 0) gold = fact;
    const auto body = haystack_run(ctx.haystack, ctx.rng.below(ctx.haystack.sentences.size()),
                                   3 + ctx.rng.below(4));
    documents.push_back(fact.statement + " " + join(body, " "));
  }
  const double depth = sample_depth(ctx.index, ctx.request.samples);
  const std::string instruction =
      "Answer the question based on the given documents. Only give me the answer and do "
      "not output any other words.";
  const auto build_prompt = [&](int64_t n) {
    // Document 0 is gold; the ones after it are distractors; the gold moves to the depth.
    std::vector<std::string> docs(documents.begin() + 1, documents.begin() + n);
    const auto at = static_cast<size_t>(depth * static_cast<double>(docs.size()) + 0.5);
    docs.insert(docs.begin() + static_cast<std::ptrdiff_t>(at), documents[0]);
    std::string context;
    for (size_t i = 0; i < docs.size(); ++i)
      context += "Document " + std::to_string(i + 1) + ":\n" + docs[i] + "\n\n";
    return instruction + "\n\nThe following are given documents.\n\n" + context + instruction +
           "\n\nQuestion: " + gold.question + " Answer:";
  };
  const std::string answer_text = spaced(gold.answer);
  const int64_t n = fit_units(
      ctx.counter, ctx.request.length, max_docs,
      [&](int64_t k) { return build_prompt(k) + answer_text; }, ctx.request.task);
  nlohmann::json params = {
      {"documents", n}, {"depth", depth}, {"fact_kind", kind}, {"question", gold.question}};
  return make_record(ctx.request.task, build_prompt(n), answer_text, {gold.answer},
                     std::move(params), ctx.counter);
}

}  // namespace headwise::tasks
