#include "headwise/tokenize/tokenizer.hpp"

#include <unordered_map>
#include <unordered_set>

#include "added_tokens.hpp"
#include "bpe.hpp"
#include "decoders.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "json_fields.hpp"
#include "normalizers.hpp"
#include "pre_tokenizers.hpp"
#include "utf8.hpp"

namespace headwise::tokenize {
namespace fs = std::filesystem;

struct Tokenizer::Impl {
  fs::path path;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<AddedVocabulary> added;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  std::unordered_map<int32_t, size_t> added_by_id;  // id -> index in added->tokens()
  int64_t vocab_size = 0;

  const std::string* token_of(int32_t id) const {
    if (const auto it = added_by_id.find(id); it != added_by_id.end())
      return &added->tokens()[it->second].decoded;
    const std::string& token = model->id_to_token(id);
    return token.empty() ? nullptr : &token;
  }
};

namespace {

fs::path resolve(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path file = path / "tokenizer.json";
    if (!fs::exists(file, ec))
      throw_input_error("{}: no tokenizer.json in this folder", path.string());
    return file;
  }
  return path;
}

std::unique_ptr<BpeModel> make_model(const nlohmann::json& config, const std::string& where) {
  const std::string type = config.contains("type") ? require_string(config, "type", where) : "BPE";
  if (type != "BPE") {
    throw_unsupported(
        "{}: unsupported tokenizer model type '{}' (supported: BPE, byte-level or with byte "
        "fallback)",
        where, type);
  }
  return std::make_unique<BpeModel>(config, where);
}

}  // namespace

Tokenizer Tokenizer::from_file(const fs::path& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = resolve(path);
  const nlohmann::json json = read_json_file(impl->path);
  const std::string file = impl->path.string();
  if (!json.is_object()) throw_input_error("{}: expected a JSON object", file);
  const auto section = [&](const char* name) -> const nlohmann::json& {
    static const nlohmann::json null;
    return json.contains(name) ? json.at(name) : null;
  };
  impl->normalizer = make_normalizer(section("normalizer"), file + ": normalizer");
  impl->pre_tokenizer = make_pre_tokenizer(section("pre_tokenizer"), file + ": pre_tokenizer");
  impl->model = make_model(require_field(json, "model", file), file + ": model");
  impl->added = std::make_unique<AddedVocabulary>(section("added_tokens"), impl->normalizer.get(),
                                                  file + ": added_tokens");
  impl->post_processor = make_post_processor(section("post_processor"), file + ": post_processor");
  impl->decoder = make_decoder(section("decoder"), file + ": decoder");
  impl->vocab_size = static_cast<int64_t>(impl->model->size());
  for (size_t i = 0; i < impl->added->tokens().size(); ++i) {
    const int32_t id = impl->added->tokens()[i].id;
    impl->added_by_id[id] = i;
    impl->vocab_size = std::max<int64_t>(impl->vocab_size, id + 1);
  }
  return Tokenizer(std::move(impl));
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int64_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (const size_t bad = utf8::find_invalid(text); bad != std::string_view::npos) {
    throw_input_error("text to tokenize is not valid UTF-8 (byte offset {})", bad);
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  std::vector<Piece> pieces;
  for (auto& segment : impl_->added->split(text, impl_->normalizer.get())) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    pieces.clear();
    pieces.push_back({std::move(segment.text), segment.at_input_start});
    if (impl_->pre_tokenizer) impl_->pre_tokenizer->pre_tokenize(pieces);
    for (const auto& piece : pieces) impl_->model->encode_word(piece.text, ids);
  }
  if (add_special_tokens && impl_->post_processor) impl_->post_processor->process(ids);
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    const std::string* token =
        id >= 0 && id <= INT32_MAX ? impl_->token_of(static_cast<int32_t>(id)) : nullptr;
    if (token == nullptr)
      throw_input_error("{}: id {} (position {}) is not in the vocabulary", impl_->path.string(),
                        id, i);
    if (skip_special_tokens) {
      const auto it = impl_->added_by_id.find(static_cast<int32_t>(id));
      if (it != impl_->added_by_id.end() && impl_->added->tokens()[it->second].special) continue;
    }
    tokens.push_back(*token);
  }
  if (!impl_->decoder) {
    // Without a decoder, upstream joins tokens with spaces.
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) joined += (i ? " " : "") + tokens[i];
    return joined;
  }
  impl_->decoder->decode_chain(tokens);
  std::string out;
  for (const auto& token : tokens) out += token;
  return out;
}

int64_t Tokenizer::vocab_size() const {
  return impl_->vocab_size;
}

std::optional<int64_t> Tokenizer::token_to_id(std::string_view token) const {
  for (const auto& added : impl_->added->tokens()) {
    if (added.content == token) return added.id;
  }
  const auto it = impl_->model->vocab().find(token);
  if (it == impl_->model->vocab().end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::id_to_token(int64_t id) const {
  const std::string* token =
      id >= 0 && id <= INT32_MAX ? impl_->token_of(static_cast<int32_t>(id)) : nullptr;
  return token ? *token : std::string();
}

const fs::path& Tokenizer::path() const {
  return impl_->path;
}

}  // namespace headwise::tokenize
