#include "haystack.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "headwise/core/data_dir.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"

namespace headwise::tasks {
namespace fs = std::filesystem;
namespace {

const std::vector<std::string> kAdjectives = {
    "amber",   "ancient",   "bold",   "brave",  "bright", "calm",   "clever", "crimson",
    "curious", "distant",   "eager",  "faint",  "fierce", "gentle", "golden", "hidden",
    "hollow",  "humble",    "icy",    "jolly",  "lively", "lonely", "lucky",  "mellow",
    "misty",   "noble",     "odd",    "pale",   "proud",  "quiet",  "rapid",  "rusty",
    "silent",  "silver",    "sleepy", "smooth", "sturdy", "swift",  "tender", "tiny",
    "vivid",   "wandering", "wild",   "windy",  "wise",   "wooden", "young",  "zealous"};
const std::vector<std::string> kNouns = {
    "anchor", "apple",   "badger", "barrel",  "beacon", "candle", "canyon",  "castle", "cedar",
    "comet",  "compass", "falcon", "feather", "forest", "garden", "glacier", "harbor", "island",
    "ladder", "lantern", "meadow", "mirror",  "monkey", "needle", "orchard", "otter",  "pebble",
    "pepper", "pillow",  "planet", "pocket",  "quarry", "rabbit", "raven",   "ribbon", "river",
    "saddle", "shadow",  "spider", "spoon",   "summit", "teapot", "thunder", "tiger",  "tunnel",
    "violin", "wagon",   "walrus", "willow"};
const std::vector<std::string> kFirstNames = {
    "Ada",   "Amara", "Arjun",   "Beatrix", "Bruno", "Camille", "Chen",  "Dara", "Diego",
    "Elena", "Emeka", "Farah",   "Felix",   "Greta", "Hana",    "Hugo",  "Ines", "Ivan",
    "Jonas", "Kaito", "Lena",    "Luca",    "Maya",  "Milo",    "Nadia", "Nils", "Olga",
    "Omar",  "Priya", "Quentin", "Rosa",    "Rui",   "Sana",    "Soren", "Tara", "Tomas",
    "Uma",   "Vera",  "Wen",     "Yara",    "Yusuf", "Zoe"};
const std::vector<std::string> kLastNames = {
    "Abbott", "Bergstrom", "Castillo", "Dimitrov", "Eriksen", "Fontaine", "Garcia",
    "Haddad", "Ivanova",   "Jansen",   "Kowalski", "Larsen",  "Moreau",   "Nakamura",
    "Okafor", "Petrov",    "Quinn",    "Rossi",    "Schmidt", "Tanaka",   "Umarov",
    "Varga",  "Whitfield", "Xu",       "Yilmaz",   "Zamora"};
const std::vector<std::string> kCities = {
    "Aldermoor",   "Brightwater", "Caldera Bay", "Dunmore",       "Eastbrook",  "Fairhaven",
    "Glenford",    "Highcliff",   "Ironvale",    "Juniper Falls", "Kingsport",  "Larkspur",
    "Millbrook",   "Northgate",   "Oakridge",    "Port Ellis",    "Queensbury", "Redwater",
    "Stonebridge", "Thornbury",   "Upton Marsh", "Valewood",      "Westmere",   "Yarrowby"};

std::vector<std::string> split_sentences(const std::string& paragraph) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (size_t i = 0; i < paragraph.size(); ++i) {
    const char c = paragraph[i];
    const bool end = (c == '.' || c == '?' || c == '!') &&
                     (i + 1 == paragraph.size() || paragraph[i + 1] == ' ');
    if (!end) continue;
    out.push_back(paragraph.substr(begin, i + 1 - begin));
    begin = i + 2;
  }
  if (begin < paragraph.size()) out.push_back(paragraph.substr(begin));
  return out;
}

Haystack read_haystack(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  if (fs::is_directory(dir, ec)) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() == ".txt") files.push_back(entry.path());
    }
  }
  if (files.empty())
    throw_input_error("{}: no haystack .txt files (expected calib-data/haystack)", dir.string());
  std::sort(files.begin(), files.end());
  Haystack haystack;
  std::set<std::string> words;
  for (const auto& file : files) {
    const std::string text = read_text_file(file);
    size_t begin = 0;
    while (begin < text.size()) {
      size_t end = text.find('\n', begin);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(begin, end - begin);
      begin = end + 1;
      // Title lines (no final full stop) are skipped: they read oddly inside a haystack.
      if (line.size() < 2 || line.back() != '.') continue;
      for (auto& sentence : split_sentences(line))
        haystack.sentences.push_back(std::move(sentence));
      std::string word;
      for (char c : line + " ") {
        if (c >= 'a' && c <= 'z') {
          word.push_back(c);
          continue;
        }
        if (word.size() >= 4) words.insert(word);
        word.clear();
      }
    }
  }
  haystack.words.assign(words.begin(), words.end());
  return haystack;
}

}  // namespace

const Haystack& load_haystack(const fs::path& dir) {
  static std::mutex mutex;
  static std::map<fs::path, Haystack> cache;
  std::lock_guard lock(mutex);
  const fs::path resolved = dir.empty() ? data_dir() / "calib-data" / "haystack" : dir;
  auto it = cache.find(resolved);
  if (it == cache.end()) it = cache.emplace(resolved, read_haystack(resolved)).first;
  return it->second;
}

std::vector<std::string> haystack_run(const Haystack& haystack, size_t start, size_t count) {
  std::vector<std::string> out;
  out.reserve(count);
  for (size_t i = 0; i < count; ++i)
    out.push_back(haystack.sentences[(start + i) % haystack.sentences.size()]);
  return out;
}

std::vector<std::string> noise_run(size_t count) {
  static const std::vector<std::string> noise = {"The grass is green.", "The sky is blue.",
                                                 "The sun is yellow.", "Here we go.",
                                                 "There and back again."};
  std::vector<std::string> out;
  for (size_t i = 0; i < count; ++i) out.push_back(noise[i % noise.size()]);
  return out;
}

std::vector<std::string> random_keys(Rng& rng, size_t count) {
  std::set<std::string> seen;
  std::vector<std::string> keys;
  while (keys.size() < count) {
    std::string key = rng.pick(kAdjectives) + "-" + rng.pick(kNouns);
    if (seen.insert(key).second) keys.push_back(std::move(key));
  }
  return keys;
}

std::vector<std::string> word_pool(const Haystack& haystack, Rng& rng, size_t count) {
  std::vector<std::string> pool = haystack.words;
  // Made-up words from syllables extend the pool when a long list needs more words.
  static const std::vector<std::string> syllables = {"ba",  "ke",  "lo",  "mi", "nu",  "ra",
                                                     "so",  "ti",  "ve",  "zu", "dor", "fen",
                                                     "gal", "hob", "pim", "tur"};
  // Word n spells n + 256 in base 16 with one syllable per digit: distinct by construction
  // (at least three syllables), and never running out however long the list.
  std::set<std::string> seen(pool.begin(), pool.end());
  for (size_t n = 256; pool.size() < count; ++n) {
    std::string word;
    for (size_t v = n; v > 0; v /= syllables.size()) word = syllables[v % syllables.size()] + word;
    if (seen.insert(word).second) pool.push_back(word);
  }
  rng.shuffle(pool);
  pool.resize(count);
  return pool;
}

std::vector<std::string> person_names(Rng& rng, size_t count) {
  std::set<std::string> seen;
  std::vector<std::string> names;
  while (names.size() < count) {
    std::string name = rng.pick(kFirstNames) + " " + rng.pick(kLastNames);
    if (seen.insert(name).second) names.push_back(std::move(name));
  }
  return names;
}

std::string random_number(Rng& rng, int digits) {
  std::string out(1, static_cast<char>('1' + rng.below(9)));
  while (static_cast<int>(out.size()) < digits)
    out.push_back(static_cast<char>('0' + rng.below(10)));
  return out;
}

const std::vector<std::string>& city_names() {
  return kCities;
}

double sample_depth(int64_t index, int64_t samples) {
  return samples <= 1 ? 0.5 : static_cast<double>(index) / static_cast<double>(samples - 1);
}

std::vector<std::string> insert_at_depths(
    std::vector<std::string> sentences, const std::vector<std::pair<double, std::string>>& items) {
  std::vector<std::pair<size_t, std::string>> positioned;
  for (const auto& [depth, text] : items) {
    const double clamped = std::clamp(depth, 0.0, 1.0);
    positioned.emplace_back(
        static_cast<size_t>(clamped * static_cast<double>(sentences.size()) + 0.5), text);
  }
  // Insert from the back so earlier positions stay valid; stable for equal positions.
  std::stable_sort(positioned.begin(), positioned.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto it = positioned.rbegin(); it != positioned.rend(); ++it) {
    sentences.insert(
        sentences.begin() + static_cast<std::ptrdiff_t>(std::min(it->first, sentences.size())),
        it->second);
  }
  return sentences;
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

std::string spaced(const std::string& text, const std::string& suffix) {
  std::string out(" ");
  out.append(text).append(suffix);
  return out;
}

int64_t fit_units(const TokenCounter& counter, int64_t length, int64_t max_units,
                  const std::function<std::string(int64_t)>& build, const std::string& task) {
  const auto fits = [&](int64_t n) { return counter.count(build(n)) <= length; };
  if (!fits(1))
    throw_field_error("length", " {}: too short for task {} (its smallest record is longer)",
                      length, task);
  int64_t lo = 1, hi = 2;
  while (hi <= max_units && fits(hi)) {  // grow, then bisect: O(log n) full counts
    lo = hi;
    hi *= 2;
  }
  hi = std::min(hi, max_units + 1);
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

nlohmann::json make_record(const std::string& task, const std::string& prompt,
                           const std::string& answer_text, const std::vector<std::string>& answers,
                           nlohmann::json params, const TokenCounter& counter) {
  // The prompt is not stored twice: it is text minus the answer_text suffix.
  const std::string text = prompt + answer_text;
  return {{"task", task},
          {"text", text},
          {"answer_text", answer_text},
          {"answers", answers},
          {"params", std::move(params)},
          {"tokens", counter.count(text)},
          {"token_counter", counter.name()}};
}

}  // namespace headwise::tasks
