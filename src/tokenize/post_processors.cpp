#include "decoders.hpp"
#include "headwise/core/error.hpp"
#include "json_fields.hpp"

namespace headwise::tokenize {
namespace {

// Ids before and after the sequence: TemplateProcessing's "single" template, or the
// fixed [CLS] ... [SEP] of BertProcessing / RobertaProcessing.
class Wrap final : public PostProcessor {
 public:
  Wrap(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<int32_t> before_, after_;
};

class Sequence final : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& step : steps_) step->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::vector<int32_t> special_ids(const nlohmann::json& special_tokens, const std::string& name,
                                 const std::string& where) {
  if (!special_tokens.is_object() || !special_tokens.contains(name)) {
    throw_input_error("{}: template uses special token '{}' missing from special_tokens", where,
                      name);
  }
  const auto& ids =
      require_array(special_tokens.at(name), "ids", where + ".special_tokens." + name);
  std::vector<int32_t> out;
  for (const auto& id : ids) out.push_back(id.get<int32_t>());
  return out;
}

std::unique_ptr<PostProcessor> make_template(const nlohmann::json& config,
                                             const std::string& where) {
  const auto& single = require_array(config, "single", where);
  const auto& specials = require_field(config, "special_tokens", where);
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const auto& item = single[i];
    if (item.contains("Sequence")) {
      if (seen_sequence)
        throw_input_error("{}.single[{}]: the single template has two sequences", where, i);
      seen_sequence = true;
    } else if (item.contains("SpecialToken")) {
      const auto ids =
          special_ids(specials, require_string(item.at("SpecialToken"), "id", where), where);
      (seen_sequence ? after : before)
          .insert((seen_sequence ? after : before).end(), ids.begin(), ids.end());
    } else {
      throw_input_error("{}.single[{}]: expected Sequence or SpecialToken", where, i);
    }
  }
  if (!seen_sequence) throw_input_error("{}.single: the template has no Sequence", where);
  return std::make_unique<Wrap>(std::move(before), std::move(after));
}

int32_t pair_id(const nlohmann::json& config, const char* field, const std::string& where) {
  const auto& pair = require_field(config, field, where);
  if (!pair.is_array() || pair.size() != 2 || !pair[1].is_number_integer()) {
    throw_input_error("{}: field '{}' must be [token, id]", where, field);
  }
  return pair[1].get<int32_t>();
}

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& config,
                                                   const std::string& where) {
  if (config.is_null()) return nullptr;
  const std::string type = require_string(config, "type", where);
  // ByteLevel as a post-processor only trims offsets; ids are unchanged.
  if (type == "ByteLevel") return nullptr;
  if (type == "TemplateProcessing") return make_template(config, where);
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    return std::make_unique<Wrap>(std::vector<int32_t>{pair_id(config, "cls", where)},
                                  std::vector<int32_t>{pair_id(config, "sep", where)});
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> steps;
    const auto& list = require_array(config, "processors", where);
    for (size_t i = 0; i < list.size(); ++i) {
      if (auto step = make_post_processor(list[i], fmt::format("{}.processors[{}]", where, i)))
        steps.push_back(std::move(step));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw_unsupported(
      "{}: unsupported post_processor type '{}' (supported: TemplateProcessing, ByteLevel, "
      "BertProcessing, RobertaProcessing, Sequence)",
      where, type);
}

}  // namespace headwise::tokenize
