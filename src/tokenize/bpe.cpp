#include "bpe.hpp"

#include <queue>

#include "headwise/core/error.hpp"
#include "json_fields.hpp"
#include "utf8.hpp"

namespace headwise::tokenize {
namespace {

// Bounded like Hugging Face's BPE cache: once full, new words are encoded but not stored.
constexpr size_t kCacheCapacity = 1 << 17;
constexpr size_t kMaxCachedWordBytes = 256;

}  // namespace

BpeModel::BpeModel(const nlohmann::json& config, const std::string& where) {
  if (config.contains("dropout") && !config["dropout"].is_null() &&
      config["dropout"].get<double>() > 0.0) {
    throw_unsupported("{}: BPE dropout is random; calibration needs deterministic tokenization",
                      where);
  }
  load_vocab(require_field(config, "vocab", where), where + ".vocab");
  load_merges(require_field(config, "merges", where), where + ".merges");
  unk_token_ = optional_string(config, "unk_token", where);
  prefix_ = optional_string(config, "continuing_subword_prefix", where);
  suffix_ = optional_string(config, "end_of_word_suffix", where);
  fuse_unk_ = config.value("fuse_unk", false);
  byte_fallback_ = config.value("byte_fallback", false);
  ignore_merges_ = config.value("ignore_merges", false);
  if (!unk_token_.empty()) {
    unk_id_ = lookup(unk_token_);
    if (unk_id_ < 0)
      throw_input_error("{}: unk_token '{}' is not in the vocabulary", where, unk_token_);
  }
  for (int b = 0; b < 256; ++b) byte_ids_[b] = lookup(fmt::format("<0x{:02X}>", b));
}

void BpeModel::load_vocab(const nlohmann::json& vocab, const std::string& where) {
  if (!vocab.is_object()) throw_input_error("{}: expected an object of token -> id", where);
  vocab_.reserve(vocab.size());
  for (const auto& [token, id_json] : vocab.items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0) {
      throw_input_error("{}: id of token '{}' must be a non-negative integer", where, token);
    }
    const auto id = id_json.get<int32_t>();
    vocab_[token] = id;
    if (static_cast<size_t>(id) >= id_to_token_.size())
      id_to_token_.resize(static_cast<size_t>(id) + 1);
    id_to_token_[static_cast<size_t>(id)] = token;
  }
}

void BpeModel::load_merges(const nlohmann::json& merges, const std::string& where) {
  if (!merges.is_array()) throw_input_error("{}: expected a list", where);
  merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& merge = merges[rank];
    std::string left, right;
    if (merge.is_string()) {
      // Old format "a b": tokens cannot contain a space, so the split is unambiguous.
      const auto text = merge.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
        throw_input_error("{}[{}]: merge '{}' is not two tokens separated by one space", where,
                          rank, text);
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      throw_input_error("{}[{}]: expected \"a b\" or [\"a\", \"b\"]", where, rank);
    }
    const int32_t a = lookup(left), b = lookup(right), merged = lookup(left + right);
    if (a < 0 || b < 0 || merged < 0) {
      throw_input_error("{}[{}]: merge '{}' + '{}' uses a token missing from the vocabulary", where,
                        rank, left, right);
    }
    // A repeated pair keeps its last rank, as Hugging Face's HashMap collection does.
    merges_[pair_key(a, b)] = {static_cast<int32_t>(rank), merged};
  }
}

int32_t BpeModel::lookup(std::string_view token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string& BpeModel::id_to_token(int32_t id) const {
  static const std::string empty;
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return empty;
  return id_to_token_[static_cast<size_t>(id)];
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& ids) const {
  int32_t pending_unk = -1;  // a run of unknown characters waiting to be emitted (fuse_unk)
  std::string affixed;
  for (size_t pos = 0; pos < word.size();) {
    const size_t begin = pos;
    pos += utf8::sequence_length(static_cast<unsigned char>(word[pos]));
    std::string_view symbol = word.substr(begin, pos - begin);
    if ((begin > 0 && !prefix_.empty()) || (pos >= word.size() && !suffix_.empty())) {
      affixed = std::string(begin > 0 ? prefix_ : "") + std::string(symbol) +
                (pos >= word.size() ? suffix_ : "");
      symbol = affixed;
    }
    if (const int32_t id = lookup(symbol); id >= 0) {
      if (pending_unk >= 0) ids.push_back(pending_unk);
      pending_unk = -1;
      ids.push_back(id);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (unsigned char c : symbol) all_bytes = all_bytes && byte_ids_[c] >= 0;
      if (all_bytes) {
        // Hugging Face does not flush a pending unk here; the byte ids go first.
        for (unsigned char c : symbol) ids.push_back(byte_ids_[c]);
        continue;
      }
    }
    if (unk_id_ < 0) continue;  // no unk token: the character is dropped, as upstream
    if (pending_unk >= 0 && !fuse_unk_) ids.push_back(pending_unk);
    pending_unk = unk_id_;
  }
  if (pending_unk >= 0) ids.push_back(pending_unk);
}

void BpeModel::merge_symbols(std::vector<int32_t>& ids) const {
  const int n = static_cast<int>(ids.size());
  if (n < 2) return;
  std::vector<int> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  std::vector<bool> alive(static_cast<size_t>(n), true);
  for (int i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  // Candidates ordered by (rank, left position): the lowest rank merges first and ties go
  // to the leftmost pair, which is Hugging Face's order. Stale entries are skipped on pop.
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    const auto it = merges_.find(pair_key(ids[left], ids[next[left]]));
    if (it != merges_.end()) queue.push({it->second.rank, left, it->second.new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    if (!alive[top.pos] || next[top.pos] < 0) continue;
    const int right = next[top.pos];
    const auto it = merges_.find(pair_key(ids[top.pos], ids[right]));
    if (it == merges_.end() || it->second.new_id != top.new_id || it->second.rank != top.rank)
      continue;
    ids[top.pos] = top.new_id;
    alive[right] = false;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    push(prev[top.pos]);
    push(top.pos);
  }
  size_t out = 0;
  for (int i = 0; i >= 0; i = next[i]) ids[out++] = ids[i];
  ids.resize(out);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    if (const int32_t id = lookup(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (const auto it = cache_.find(word); it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  initial_symbols(word, ids);
  merge_symbols(ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(ids));
  }
}

}  // namespace headwise::tokenize
