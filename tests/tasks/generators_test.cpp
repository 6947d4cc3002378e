// Synthetic calibration generators: determinism, lengths, answers present, depth spread.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "../support/test_paths.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/tasks/generators.hpp"
#include "headwise/tokenize/tokenizer.hpp"

using namespace headwise;
namespace fs = std::filesystem;

namespace {

const tokenize::Tokenizer& fixture_tokenizer() {
  static const auto tok = tokenize::Tokenizer::from_file(fs::path(HEADWISE_FIXTURES_DIR) /
                                                         "tokenizers" / "bytelevel_llama3");
  return tok;
}

std::vector<nlohmann::json> generate(const std::string& task, int64_t length, int64_t samples,
                                     uint64_t seed) {
  const auto counter = tasks::make_token_counter(&fixture_tokenizer());
  return tasks::generate_calibration({task, length, samples, seed, {}}, *counter);
}

}  // namespace

TEST_CASE("every task fills the length without exceeding it and states its answers", "[tasks]") {
  for (const auto& task : tasks::generator_tasks()) {
    INFO(task);
    const auto records = generate(task, 1500, 2, 7);
    REQUIRE(records.size() == 2);
    for (const auto& record : records) {
      const std::string text = record["text"], suffix = record["answer_text"];
      REQUIRE(text.size() > suffix.size());
      REQUIRE(text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0);
      const std::string prompt = text.substr(0, text.size() - suffix.size());
      const auto tokens = static_cast<int64_t>(fixture_tokenizer().encode(text, true).size());
      CHECK(tokens == record["tokens"].get<int64_t>());
      CHECK(tokens <= 1500);
      CHECK(tokens >= 1200);
      CHECK(record["task"] == task);
      REQUIRE_FALSE(record["answers"].empty());
      for (const auto& answer : record["answers"]) {
        // The answer is in the context (what the model must retrieve) and after the prompt.
        if (task != "common_words")
          CHECK(prompt.find(answer.get<std::string>()) != std::string::npos);
        CHECK(text.find(answer.get<std::string>(), prompt.size()) != std::string::npos);
      }
    }
  }
}

TEST_CASE("generation is deterministic for a seed", "[tasks]") {
  for (const auto& task : tasks::generator_tasks()) {
    INFO(task);
    const auto a = generate(task, 600, 2, 11), b = generate(task, 600, 2, 11),
               c = generate(task, 600, 2, 12);
    CHECK(a == b);
    CHECK(a != c);
  }
}

TEST_CASE("needle depths spread evenly across samples", "[tasks]") {
  const auto records = generate("niah_single", 2000, 3, 3);
  std::vector<double> depths;
  for (const auto& record : records) {
    const std::string prompt = record["text"];
    const size_t at = prompt.find("One of the special magic numbers");
    REQUIRE(at != std::string::npos);
    depths.push_back(static_cast<double>(at) / static_cast<double>(prompt.size()));
    CHECK(record["params"]["depth"].get<double>() ==
          Approx(0.5 * static_cast<double>(depths.size() - 1)));
  }
  CHECK(depths[0] < 0.15);
  CHECK(depths[1] == Approx(0.5).margin(0.1));
  CHECK(depths[2] > 0.85);
}

TEST_CASE("generator errors name the flag", "[tasks]") {
  const auto counter = tasks::make_token_counter(nullptr);
  CHECK(counter->count("héllo") == 6);  // byte fallback counts UTF-8 bytes
  CHECK_THROWS_WITH(tasks::generate_calibration({"no_such_task", 100, 1, 0, {}}, *counter),
                    Catch::Contains("--task no_such_task: unknown task"));
  CHECK_THROWS_WITH(tasks::generate_calibration({"niah_single", 20, 1, 0, {}}, *counter),
                    Catch::Contains("--length 20: too short"));
  CHECK_THROWS_WITH(tasks::generate_calibration({"locomo", 100, 0, 0, {}}, *counter),
                    Catch::Contains("--samples"));
}

TEST_CASE("make-calib writes JSONL that the CLI reports", "[tasks]") {
  const fs::path out = fs::temp_directory_path() / "headwise-make-calib.jsonl";
  const std::string tok =
      (fs::path(HEADWISE_FIXTURES_DIR) / "tokenizers" / "sentencepiece_llama2").string();
  const std::string command = std::string(HEADWISE_CLI) +
                              " make-calib -q --task qa_distractors --length 2k --samples 3 " +
                              "--seed 5 --tokenizer " + tok + " -o " + out.string();
  REQUIRE(std::system(command.c_str()) == 0);
  const std::string text = read_text_file(out);
  CHECK(std::count(text.begin(), text.end(), '\n') == 3);
  const auto first = nlohmann::json::parse(text.substr(0, text.find('\n')));
  CHECK(first["params"]["length"] == 2048);
  CHECK(first["tokens"].get<int64_t>() <= 2048);
  const std::string bad = std::string(HEADWISE_CLI) +
                          " make-calib -q --task nope --length 100 -o " + out.string() +
                          " 2>/dev/null";
  CHECK(WEXITSTATUS(std::system(bad.c_str())) == 1);
}
