// Calibration set reader: formats, packing/cutting and the errors users see.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "../support/test_paths.hpp"
#include "headwise/calib/calibration_file.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/tokenize/tokenizer.hpp"

using namespace headwise;
namespace fs = std::filesystem;

namespace {

fs::path write_jsonl(const std::string& name, const std::string& contents) {
  const fs::path dir = fs::temp_directory_path() / "headwise-dataset-test";
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << contents;
  return dir / name;
}

std::string error_of(const fs::path& path, const tokenize::Tokenizer* tok, int64_t seq_len,
                     int64_t samples, int64_t vocab = 100) {
  try {
    (void)calib::load_calibration_set(path, tok, seq_len, samples, vocab);
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("pre-tokenized records are cut and packed", "[calib]") {
  const auto path = write_jsonl("ids.jsonl",
                                "{\"input_ids\": [1,2,3,4,5,6,7]}\n"  // longer than 4: cut to 1..4
                                "\n"
                                "{\"input_ids\": [10,11], \"answer\": \"x\"}\n"  // short: packed
                                "{\"input_ids\": [12,13,14]}\n"
                                "{\"input_ids\": [20,21,22,23]}\n");
  const auto set = calib::load_calibration_set(path, nullptr, 4, 3, 100);
  REQUIRE(set.sequences.size() == 3);
  CHECK(set.sequences[0] == std::vector<int64_t>{1, 2, 3, 4});
  CHECK(set.sequences[1] == std::vector<int64_t>{10, 11, 12, 13});
  CHECK(set.sequences[2] == std::vector<int64_t>{20, 21, 22, 23});
  CHECK(set.records_cut == 1);
  CHECK(set.records_packed == 2);
  CHECK(set.tokens_dropped == 3 + 1);  // tail 5,6,7 and the leftover 14
  CHECK(set.records_in_file == 4);
  CHECK(set.format == "input_ids");
  CHECK(set.sha256 == sha256_file_hex(path));
  // samples <= 0 takes everything; asking for more than the file holds is an error.
  CHECK(calib::load_calibration_set(path, nullptr, 4, 0, 100).sequences.size() == 3);
  CHECK(error_of(path, nullptr, 4, 5).find("gives 3 sequence(s) of 4 tokens, 5 asked for") !=
        std::string::npos);
}

TEST_CASE("text records use the tokenizer", "[calib]") {
  const auto tok = tokenize::Tokenizer::from_file(fs::path(HEADWISE_FIXTURES_DIR) / "tokenizers" /
                                                  "sentencepiece_llama2");
  const std::string text = "The quick brown fox jumps over the lazy dog; the dog didn't mind.";
  const auto path = write_jsonl("text.jsonl", "{\"text\": \"" + text + "\"}\n");
  const auto expected = tok.encode(text, true);
  const auto set = calib::load_calibration_set(path, &tok, 5, 1, tok.vocab_size());
  REQUIRE(set.sequences.size() == 1);
  CHECK(set.sequences[0] == std::vector<int64_t>(expected.begin(), expected.begin() + 5));
  CHECK(set.sequences[0][0] == 1);  // BOS from the post-processor
  CHECK(set.format == "text");
  CHECK(error_of(path, nullptr, 5, 1).find("text.jsonl:1: text record but no tokenizer") !=
        std::string::npos);
}

TEST_CASE("bad calibration files name file and line", "[calib]") {
  CHECK(error_of(write_jsonl("empty.jsonl", "\n  \n"), nullptr, 4, 1)
            .find("empty calibration file") != std::string::npos);
  CHECK(error_of(write_jsonl("bad.jsonl", "{\"input_ids\": [1,2,3,4]}\n{\"input_ids\": [1,2\n"),
                 nullptr, 4, 1)
            .find("bad.jsonl:2: malformed JSON") != std::string::npos);
  CHECK(
      error_of(write_jsonl("range.jsonl", "{\"input_ids\": [1]}\n\n{\"input_ids\": [5, 100]}\n"),
               nullptr, 1, 3)
          .find(
              "range.jsonl:3: input_ids id 100 at position 1 is outside the vocabulary [0, 100)") !=
      std::string::npos);
  CHECK(error_of(write_jsonl("neg.jsonl", "{\"input_ids\": [-1]}\n"), nullptr, 1, 1)
            .find("neg.jsonl:1") != std::string::npos);
  CHECK(error_of(write_jsonl("none.jsonl", "{\"prompt\": \"x\"}\n"), nullptr, 1, 1)
            .find("none.jsonl:1: a record needs") != std::string::npos);
  CHECK(error_of(write_jsonl("type.jsonl", "{\"input_ids\": [1, \"2\"]}\n"), nullptr, 1, 1)
            .find("input_ids[1]") != std::string::npos);
  CHECK(
      error_of(fs::temp_directory_path() / "headwise-dataset-test" / "missing.jsonl", nullptr, 1, 1)
          .find("no such file") != std::string::npos);
}

TEST_CASE("the shipped calibration sets load with the tokenizer they were sized with", "[calib]") {
  const fs::path root = fs::path(HEADWISE_SOURCE_DIR) / "calib-data";
  const auto manifest = read_json_file(root / "manifest.json");
  const auto tok = tokenize::Tokenizer::from_file(fs::path(HEADWISE_FIXTURES_DIR) / "tokenizers" /
                                                  "bytelevel_qwen");
  REQUIRE(manifest["sets"].size() >= 3);
  for (const auto& entry : manifest["sets"]) {
    INFO(entry["name"]);
    const auto set = calib::load_calibration_set(root / entry["file"].get<std::string>(), &tok,
                                                 1024, 2, tok.vocab_size());
    CHECK(set.sequences.size() == 2);
    CHECK(set.sha256 == entry["sha256"].get<std::string>());  // the manifest is current
  }
}
