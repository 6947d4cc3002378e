#include "headwise/calib/calibration_file.hpp"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/tokenize/tokenizer.hpp"

namespace headwise::calib {
namespace {

struct Record {
  std::vector<int64_t> ids;
  bool is_text = false;
};

// Every line is parsed and checked for shape, even after enough sequences are collected,
// so a broken file is reported whatever --samples is.
nlohmann::json parse_line(std::string_view line, const std::string& where) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e999
    throw_input_error("{}: malformed JSON ({})", where, e.what());
  }
  if (!json.is_object())
    throw_input_error("{}: expected a JSON object with \"text\" or \"input_ids\"", where);
  if (json.contains("text") == json.contains("input_ids")) {
    throw_input_error("{}: a record needs exactly one of \"text\" and \"input_ids\"", where);
  }
  return json;
}

Record parse_record(const nlohmann::json& json, const std::string& where,
                    const tokenize::Tokenizer* tokenizer) {
  const bool has_text = json.contains("text");
  Record record;
  if (has_text) {
    if (!json["text"].is_string()) throw_input_error("{}: field \"text\" must be a string", where);
    if (tokenizer == nullptr) {
      throw_input_error(
          "{}: text record but no tokenizer is available (give the model folder with its "
          "tokenizer.json, or pre-tokenize to {{\"input_ids\": [...]}})",
          where);
    }
    record.is_text = true;
    try {
      record.ids = tokenizer->encode(json["text"].get<std::string>(), true);
    } catch (const InputError& e) {
      throw_input_error("{}: field \"text\": {}", where, e.what());
    }
    return record;
  }
  const auto& ids = json["input_ids"];
  if (!ids.is_array())
    throw_input_error("{}: field \"input_ids\" must be a list of integers", where);
  record.ids.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!ids[i].is_number_integer())
      throw_input_error("{}: input_ids[{}] is not an integer", where, i);
    record.ids.push_back(ids[i].get<int64_t>());
  }
  return record;
}

void check_vocabulary(const Record& record, int64_t vocab_size, const std::string& where) {
  for (size_t i = 0; i < record.ids.size(); ++i) {
    const int64_t id = record.ids[i];
    if (id < 0 || id >= vocab_size) {
      throw_input_error("{}: {} id {} at position {} is outside the vocabulary [0, {})", where,
                        record.is_text ? "tokenized" : "input_ids", id, i, vocab_size);
    }
  }
}

// Accumulates records into fixed-length sequences.
class Packer {
 public:
  Packer(CalibrationSet& set, int64_t seq_len, int64_t samples)
      : set_(set), seq_len_(seq_len), samples_(samples) {}
  bool full() const {
    return samples_ > 0 && static_cast<int64_t>(set_.sequences.size()) >= samples_;
  }

  void add(const std::vector<int64_t>& ids) {
    const auto n = static_cast<int64_t>(ids.size());
    if (n == 0) return;
    ++set_.records_used;
    if (n >= seq_len_) {
      set_.sequences.emplace_back(ids.begin(), ids.begin() + seq_len_);
      set_.tokens_dropped += n - seq_len_;
      set_.records_cut += n > seq_len_;
      return;
    }
    ++set_.records_packed;
    for (int64_t id : ids) {
      pending_.push_back(id);
      if (static_cast<int64_t>(pending_.size()) == seq_len_ && !full()) {
        set_.sequences.push_back(std::move(pending_));
        pending_.clear();
      }
    }
  }
  void finish() {
    set_.tokens_dropped += static_cast<int64_t>(pending_.size());
    if (samples_ > 0 && static_cast<int64_t>(set_.sequences.size()) > samples_)
      set_.sequences.resize(samples_);
  }

 private:
  CalibrationSet& set_;
  int64_t seq_len_, samples_;
  std::vector<int64_t> pending_;
};

}  // namespace

CalibrationSet load_calibration_set(const std::filesystem::path& path,
                                    const tokenize::Tokenizer* tokenizer, int64_t seq_len,
                                    int64_t samples, int64_t vocab_size,
                                    std::string_view samples_flag) {
  const std::string file = path.string();
  if (seq_len <= 0)
    throw_input_error("{}: sequence length must be positive, got {}", file, seq_len);
  if (vocab_size <= 0)
    throw_input_error("{}: vocabulary size must be positive, got {}", file, vocab_size);
  const std::string bytes = read_text_file(path);
  CalibrationSet set;
  set.path = file;
  set.sha256 = sha256_hex(bytes);
  Packer packer(set, seq_len, samples);
  bool any_text = false, any_ids = false;
  size_t line_number = 0;
  for (size_t begin = 0; begin < bytes.size();) {
    const size_t end = std::min(bytes.find('\n', begin), bytes.size());
    std::string_view line(bytes.data() + begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    ++set.records_in_file;
    const std::string where = fmt::format("{}:{}", file, line_number);
    const nlohmann::json json = parse_line(line, where);
    if (packer.full()) continue;  // still validated, but no longer tokenized
    const Record record = parse_record(json, where, tokenizer);
    check_vocabulary(record, vocab_size, where);
    (record.is_text ? any_text : any_ids) = true;
    packer.add(record.ids);
  }
  if (set.records_in_file == 0)
    throw_input_error("{}: empty calibration file (no JSONL records)", file);
  packer.finish();
  set.format = any_text && any_ids ? "mixed" : any_text ? "text" : "input_ids";
  const auto got = static_cast<int64_t>(set.sequences.size());
  if (got == 0 || (samples > 0 && got < samples)) {
    throw_input_error(
        "{}: gives {} sequence(s) of {} tokens, {} asked for ({}); use a shorter sequence length, "
        "a smaller {} or more data",
        file, got, seq_len, samples > 0 ? samples : 1, samples_flag, samples_flag);
  }
  spdlog::info("calibration set {}: {} sequences x {} tokens from {} of {} records ({}), sha256 {}",
               file, got, seq_len, set.records_used, set.records_in_file, set.format,
               set.sha256.substr(0, 16));
  if (set.records_cut > 0)
    spdlog::info("  {} record(s) longer than {} tokens were cut", set.records_cut, seq_len);
  if (set.records_packed > 0)
    spdlog::info("  {} shorter record(s) were packed together", set.records_packed);
  if (set.tokens_dropped > 0)
    spdlog::info("  {} token(s) dropped (cut tails, unfinished last pack)", set.tokens_dropped);
  return set;
}

}  // namespace headwise::calib
