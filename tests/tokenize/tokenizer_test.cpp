// Parity of the C++ tokenizer with Hugging Face `tokenizers` (references made by
// tools/make_tokenizers.py with the version pinned in versions.env).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "../support/test_paths.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/tokenize/tokenizer.hpp"

using namespace headwise;
using headwise::tokenize::Tokenizer;
namespace fs = std::filesystem;

namespace {

const fs::path kFixtures = fs::path(HEADWISE_FIXTURES_DIR) / "tokenizers";
const char* const kNames[] = {"bytelevel_qwen", "bytelevel_llama3", "sentencepiece_llama2",
                              "sentencepiece_gemma"};

std::vector<nlohmann::json> read_jsonl(const fs::path& path) {
  std::vector<nlohmann::json> records;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

std::vector<int64_t> ids_of(const nlohmann::json& array) {
  return array.get<std::vector<int64_t>>();
}

std::string pinned(const std::string& name) {
  const std::string env = read_text_file(fs::path(HEADWISE_SOURCE_DIR) / "versions.env");
  const size_t at = env.find(name + "=");
  REQUIRE(at != std::string::npos);
  return env.substr(at + name.size() + 1, env.find('\n', at) - at - name.size() - 1);
}

// Writes a copy of a fixture's tokenizer.json with one section replaced.
fs::path write_variant(const std::string& section, const nlohmann::json& value) {
  auto json = read_json_file(kFixtures / "bytelevel_qwen" / "tokenizer.json");
  json[section] = value;
  const fs::path dir = fs::temp_directory_path() / ("headwise-tok-" + section);
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << json.dump();
  return dir;
}

}  // namespace

TEST_CASE("references were made with the pinned tokenizers version", "[tokenize]") {
  const auto manifest = read_json_file(kFixtures / "manifest.json");
  CHECK(manifest.at("tokenizers_version").get<std::string>() == pinned("TOKENIZERS_VERSION"));
}

TEST_CASE("encode matches tokenizers on every corpus text", "[tokenize]") {
  const std::string corpus =
      read_text_file(fs::path(HEADWISE_SOURCE_DIR) / "tests/tokenize/corpus.txt");
  for (const char* name : kNames) {
    const Tokenizer tok = Tokenizer::from_file(kFixtures / name);
    const auto records = read_jsonl(kFixtures / name / "reference.jsonl");
    REQUIRE(records.size() > 50);
    size_t identical = 0, with_special = 0, decoded = 0;
    for (const auto& record : records) {
      const std::string text = record.at("text").get<std::string>();
      if (record.at("line").get<int>() < 0)
        CHECK(text == corpus);  // the corpus changed: rerun the script
      INFO(name << " line " << record.at("line") << ": " << text);
      const auto ids = tok.encode(text, false);
      CHECK(ids == ids_of(record.at("ids")));
      identical += ids == ids_of(record.at("ids"));
      const auto special_ids = tok.encode(text, true);
      CHECK(special_ids == ids_of(record.at("ids_with_special")));
      with_special += special_ids == ids_of(record.at("ids_with_special"));
      const std::string back = tok.decode(ids_of(record.at("ids")));
      CHECK(back == record.at("decoded").get<std::string>());
      decoded += back == record.at("decoded").get<std::string>();
    }
    std::cout << "tokenizer parity " << name << ": ids " << identical << "/" << records.size()
              << ", with specials " << with_special << "/" << records.size() << ", decode "
              << decoded << "/" << records.size() << "\n";
  }
}

TEST_CASE("decode round-trips the corpus", "[tokenize]") {
  for (const char* name : kNames) {
    const Tokenizer tok = Tokenizer::from_file(kFixtures / name);
    size_t exact = 0, total = 0;
    for (const auto& record : read_jsonl(kFixtures / name / "reference.jsonl")) {
      const std::string text = record.at("text").get<std::string>();
      // Where the reference itself does not give the text back (NFC, spaces added after
      // special tokens), ours must not either: both follow the same decoder.
      const bool reference_exact = record.at("decoded").get<std::string>() == text;
      CHECK((tok.decode(tok.encode(text, false)) == text) == reference_exact);
      exact += reference_exact;
      ++total;
    }
    INFO(name);
    CHECK(exact * 10 >= total * 9);  // the corpus is mostly round-trippable by design
  }
}

TEST_CASE("vocabulary lookups agree with the file", "[tokenize]") {
  const Tokenizer tok = Tokenizer::from_file(kFixtures / "sentencepiece_llama2" / "tokenizer.json");
  const auto json = read_json_file(kFixtures / "sentencepiece_llama2" / "tokenizer.json");
  CHECK(tok.token_to_id("<s>") == 1);
  CHECK(tok.token_to_id("<0x0A>") == json["model"]["vocab"]["<0x0A>"].get<int64_t>());
  CHECK_FALSE(tok.token_to_id("no such token at all").has_value());
  CHECK(tok.id_to_token(2) == "</s>");
  int64_t max_id = 0;
  for (const auto& [token, id] : json["model"]["vocab"].items())
    max_id = std::max(max_id, id.get<int64_t>());
  for (const auto& added : json["added_tokens"])
    max_id = std::max(max_id, added["id"].get<int64_t>());
  CHECK(tok.vocab_size() == max_id + 1);
  CHECK(tok.decode(tok.encode("<s> hi", false), true) ==
        tok.decode(tok.encode(" hi", false), true));
}

TEST_CASE("bad tokenizer files and inputs name what is wrong", "[tokenize]") {
  const auto expect_error = [](const fs::path& dir, const std::string& needle) {
    try {
      (void)Tokenizer::from_file(dir);
      FAIL("accepted " << dir);
    } catch (const InputError& e) {
      const std::string what = e.what();
      CHECK(what.find(needle) != std::string::npos);
      CHECK(what.find("tokenizer.json") != std::string::npos);
    }
  };
  expect_error(write_variant("model", {{"type", "Unigram"}, {"vocab", nlohmann::json::array()}}),
               "'Unigram'");
  expect_error(write_variant("pre_tokenizer", {{"type", "BertPreTokenizer"}}),
               "'BertPreTokenizer'");
  expect_error(write_variant("normalizer", {{"type", "Precompiled"}}), "'Precompiled'");
  expect_error(write_variant("decoder", {{"type", "WordPiece"}}), "'WordPiece'");
  expect_error(fs::temp_directory_path() / "headwise-no-such-dir" / "tokenizer.json",
               "no such file");

  const Tokenizer tok = Tokenizer::from_file(kFixtures / "bytelevel_qwen");
  CHECK_THROWS_AS(tok.encode("bad \xC3\x28 utf-8", false), InputError);
  CHECK_THROWS_AS(tok.decode({tok.vocab_size()}), InputError);
  CHECK_THROWS_AS(tok.decode({-1}), InputError);
}
