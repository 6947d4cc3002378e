#pragma once
// tokenizer.json "decoder" and "post_processor" sections.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace headwise::tokenize {

// Decoders work on the list of token strings, each step rewriting the list, like
// Hugging Face's Decoder::decode_chain; the final list is concatenated.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& config, const std::string& where);

// Adds the special tokens of a single sequence (TemplateProcessing, BERT/RoBERTa style).
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;
};

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& config,
                                                   const std::string& where);

}  // namespace headwise::tokenize
