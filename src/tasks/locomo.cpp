// LoCoMo-style long conversations: two people talk over many dated sessions; personal
// facts are mentioned in early sessions and asked about at the end.
#include "headwise/core/error.hpp"
#include "text_tasks.hpp"

namespace headwise::tasks {
namespace {

struct DialogueFact {
  std::string utterance, question, answer;
};

DialogueFact make_dialogue_fact(int kind, const std::string& speaker, Rng& rng) {
  static const std::vector<std::string> pets = {"Biscuit", "Pepper",     "Juniper",
                                                "Waffles", "Clementine", "Otis"};
  static const std::vector<std::string> instruments = {"cello", "banjo",     "clarinet",
                                                       "harp",  "accordion", "oboe"};
  static const std::vector<std::string> dishes = {"lentil soup",    "mushroom risotto",
                                                  "plum dumplings", "fish stew",
                                                  "spinach pie",    "apricot tart"};
  static const std::vector<std::string> jobs = {"a bakery",        "the city library",
                                                "a boatyard",      "an observatory",
                                                "a flower market", "a printing shop"};
  switch (kind % 5) {
    case 0: {
      const auto& pet = rng.pick(pets);
      return {"We finally adopted a puppy last week, and we named her " + pet + ".",
              "What is the name of the puppy " + speaker + " adopted?", pet};
    }
    case 1: {
      const auto& city = rng.pick(city_names());
      return {"Big news: I am moving to " + city + " next month for a fresh start.",
              "Which town did " + speaker + " say they were moving to?", city};
    }
    case 2: {
      const auto& instrument = rng.pick(instruments);
      return {"I started taking " + instrument + " lessons on Thursday evenings.",
              "Which instrument did " + speaker + " start learning?", instrument};
    }
    case 3: {
      const auto& dish = rng.pick(dishes);
      return {
          "My grandmother taught me her recipe for " + dish + " and now I make it every Sunday.",
          "Which dish does " + speaker + " make every Sunday?", dish};
    }
    default: {
      const auto& job = rng.pick(jobs);
      return {"I accepted a new job at " + job + ", I start after the holidays.",
              "Where did " + speaker + " get a new job?", job};
    }
  }
}

const std::vector<std::string>& small_talk() {
  static const std::vector<std::string> lines = {
      "How have you been since we last talked?",
      "Pretty good, a busy week but a good one.",
      "That sounds lovely, tell me more.",
      "Ha, that reminds me of something I read recently.",
      "I know what you mean.",
      "Did you do anything fun over the weekend?",
      "Mostly stayed home and rested, to be honest.",
      "The weather has been strange lately.",
      "I hope things calm down for you soon.",
      "Let's catch up again in a few days.",
      "Take care, talk soon!",
      "Oh, I almost forgot to ask about your family.",
      "Everyone is well, thanks for asking."};
  return lines;
}

std::string session_date(int64_t session) {
  static const char* months[] = {"January",   "February", "March",    "April",
                                 "May",       "June",     "July",     "August",
                                 "September", "October",  "November", "December"};
  const int64_t day_of_year = session * 9;  // sessions about nine days apart, from 2 January 2023
  return std::to_string(day_of_year % 28 + 1) + " " + months[(day_of_year / 28) % 12] + " " +
         std::to_string(2023 + day_of_year / 336);
}

}  // namespace

nlohmann::json make_locomo(const TaskContext& ctx) {
  const auto names = person_names(ctx.rng, 2);
  const std::string a = names[0].substr(0, names[0].find(' ')),
                    b = names[1].substr(0, names[1].find(' '));
  const int64_t max_turns = std::max<int64_t>(8, ctx.request.length / 8);
  // Draw every turn up front; the fitter then keeps a prefix of the conversation.
  std::vector<std::string> turns;
  std::vector<int64_t> session_starts;
  for (int64_t t = 0; t < max_turns; ++t) {
    if (session_starts.empty() ||
        t - session_starts.back() >= 8 + static_cast<int64_t>(ctx.rng.below(7))) {
      session_starts.push_back(t);
    }
    const std::string& speaker = t % 2 == 0 ? a : b;
    // Two turns in three share something read (haystack prose), the rest is small talk.
    const bool chat = ctx.rng.below(3) == 0;
    turns.push_back(
        speaker + ": " +
        (chat ? ctx.rng.pick(small_talk())
              : "I was reading this the other day: " + ctx.rng.pick(ctx.haystack.sentences)));
  }
  // Three facts, said by either speaker; the first at this sample's depth.
  const double depth = sample_depth(ctx.index, ctx.request.samples);
  std::vector<std::pair<double, DialogueFact>> facts;
  const int first_kind = static_cast<int>(ctx.rng.below(5));
  for (int f = 0; f < 3; ++f) {
    const double d = f == 0 ? depth * 0.9 : static_cast<double>(ctx.rng.below(901)) / 1000.0;
    const std::string& speaker = ctx.rng.below(2) == 0 ? a : b;
    facts.emplace_back(d, make_dialogue_fact(first_kind + f, speaker, ctx.rng));
    facts.back().second.utterance = speaker + ": " + facts.back().second.utterance;
  }
  std::vector<std::string> answers;
  std::string questions, answer_text;
  for (size_t f = 0; f < facts.size(); ++f) {
    questions += "Question " + std::to_string(f + 1) + ": " + facts[f].second.question + "\n";
    answer_text += "\nAnswer " + std::to_string(f + 1) + ": " + facts[f].second.answer;
    answers.push_back(facts[f].second.answer);
  }
  const auto build_prompt = [&](int64_t n) {
    std::string text = "The following is a long conversation between " + a + " and " + b +
                       " over several sessions.\n";
    std::vector<std::pair<double, std::string>> items;
    for (const auto& [d, fact] : facts) items.emplace_back(d, fact.utterance);
    // Facts go between turns; session headers are then added at the drawn turn indices.
    const auto with_facts =
        insert_at_depths(std::vector<std::string>(turns.begin(), turns.begin() + n), items);
    int64_t session = 0;
    for (size_t t = 0, turn = 0; t < with_facts.size(); ++t) {
      const bool is_fact = std::any_of(items.begin(), items.end(),
                                       [&](const auto& it) { return it.second == with_facts[t]; });
      if (!is_fact && session < static_cast<int64_t>(session_starts.size()) &&
          session_starts[session] == static_cast<int64_t>(turn)) {
        text += "\n=== Session " + std::to_string(session + 1) + " (" + session_date(session) +
                ") ===\n";
        ++session;
      }
      text += with_facts[t] + "\n";
      turn += is_fact ? 0 : 1;
    }
    return text + "\nAnswer these questions about the conversation above.\n" + questions;
  };
  const int64_t n = fit_units(
      ctx.counter, ctx.request.length, max_turns,
      [&](int64_t k) { return build_prompt(k) + answer_text; }, ctx.request.task);
  nlohmann::json params = {
      {"speakers", {a, b}}, {"turns", n}, {"depth", depth}, {"facts", facts.size()}};
  return make_record(ctx.request.task, build_prompt(n), answer_text, answers, std::move(params),
                     ctx.counter);
}

}  // namespace headwise::tasks
