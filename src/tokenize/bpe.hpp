#pragma once
// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}): vocabulary, ranked merges,
// byte fallback, unknown-token fusing, ignore_merges, continuing-subword prefix and
// end-of-word suffix, with a per-word cache so repeated words cost one hash lookup.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace headwise::tokenize {

// Transparent hashing lets the maps be probed with string_views without copies.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  BpeModel(const nlohmann::json& config, const std::string& where);

  // Appends the ids of one pre-tokenized word to `out`.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  const Vocab& vocab() const { return vocab_; }
  // Empty when the id is not in the model's vocabulary.
  const std::string& id_to_token(int32_t id) const;
  size_t size() const { return id_to_token_.size(); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void load_vocab(const nlohmann::json& vocab, const std::string& where);
  void load_merges(const nlohmann::json& merges, const std::string& where);
  // Initial symbols of a word: one per character, or its bytes (byte fallback), or unk.
  void initial_symbols(std::string_view word, std::vector<int32_t>& ids) const;
  void merge_symbols(std::vector<int32_t>& ids) const;
  int32_t lookup(std::string_view token) const;

  Vocab vocab_;
  std::vector<std::string> id_to_token_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::string unk_token_, prefix_, suffix_;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xXX> ids for byte fallback, -1 when absent

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace headwise::tokenize
