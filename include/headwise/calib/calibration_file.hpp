#pragma once
// Calibration sets: JSONL files of {"text": ...} records (tokenized with the model's
// tokenizer) or {"input_ids": [...]} records, turned into fixed-length token sequences.
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace headwise::tokenize {
class Tokenizer;
}

namespace headwise::calib {

struct CalibrationSet {
  std::vector<std::vector<int64_t>> sequences;  // each exactly seq_len tokens
  std::string sha256;                           // of the file's bytes: goes into provenance
  std::string path;
  std::string format;           // "text", "input_ids" or "mixed"
  int64_t records_used = 0;     // records that contributed tokens
  int64_t records_in_file = 0;  // non-blank lines
  int64_t records_cut = 0;      // longer than seq_len: only the first seq_len tokens kept
  int64_t records_packed = 0;   // shorter than seq_len: packed with their neighbours
  int64_t tokens_dropped = 0;   // cut-off tails and the unfinished last pack
};

// Reads `path` and returns `samples` sequences of `seq_len` tokens (samples <= 0: as many
// as the file gives). Records at least seq_len long are cut to their first seq_len tokens;
// shorter ones are concatenated in file order and the stream is split every seq_len
// tokens. Text records are encoded with add_special_tokens (BOS where the model has one).
// Errors (InputError naming file and line): empty file, malformed JSON, a record with
// neither or both fields, text with no tokenizer, ids outside [0, vocab_size), fewer
// tokens than asked for (naming `samples_flag`, the option that asked: --samples, or
// --samples-cap under --samples auto).
CalibrationSet load_calibration_set(const std::filesystem::path& path,
                                    const tokenize::Tokenizer* tokenizer, int64_t seq_len,
                                    int64_t samples, int64_t vocab_size,
                                    std::string_view samples_flag = "--samples");

}  // namespace headwise::calib
