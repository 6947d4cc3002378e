#include "calibration_options.hpp"

#include <optional>
#include <string>
#include <type_traits>

#include "headwise/core/error.hpp"

namespace headwise::cli {

namespace {

// What --help calls a number written in `syntax` (160k tokens, 48g bytes).
std::string number_kind(calib::Syntax syntax) {
  switch (syntax) {
    case calib::Syntax::kTokens:
      return "TOKENS";
    case calib::Syntax::kBytes:
      return "SIZE";
    default:
      return "INT";
  }
}

}  // namespace

void CalibrationFlags::add_to(CLI::App& app,
                              const std::function<void(std::string_view field)>& after) {
  const calib::CalibrationOptions defaults;
  calib::visit_fields(defaults, [&](const auto& value, const calib::Field& f) {
    Flag& flag = flags_.emplace_back();
    flag.name = f.name;
    flag.flag = f.flag.empty() ? option_spelling(f.name) : std::string(f.flag);
    flag.required = (f.use & calib::kRequired) != 0;
    flag.is_switch = std::is_same_v<std::decay_t<decltype(value)>, bool> || !f.switch_sets.empty();
    if (flag.is_switch) {
      flag.text = f.switch_sets.empty() ? "true" : std::string(f.switch_sets);
      const std::string help(f.help);
      flag.option = app.add_flag(flag.flag, help);
    } else {
      using T = std::decay_t<decltype(value)>;
      flag.text = calib::field_text(value, f);
      flag.option = app.add_option(flag.flag, flag.text, std::string(f.help));
      if (std::is_integral_v<T>) {
        flag.option->type_name(f.syntax != calib::Syntax::kPlain ? number_kind(f.syntax)
                               : std::is_signed_v<T>             ? "INT"
                                                                 : "UINT");
      }
      // An optional number takes a number or the word that leaves it unset (--samples INT|auto).
      if (std::is_same_v<T, std::optional<int64_t>> && !f.unset.empty())
        flag.option->type_name(number_kind(f.syntax) + "|" + std::string(f.unset));
      if (!(f.use & calib::kHideDefault)) flag.option->capture_default_str();
    }
    if (after) after(f.name);
  });
}

calib::CalibrationRequest CalibrationFlags::request() const {
  calib::CalibrationRequest request;
  for (const Flag& flag : flags_) {
    if (flag.option->count() > 0) request[flag.name] = flag.text;
  }
  return request;
}

void CalibrationFlags::check_required() const {
  bool any = false;
  for (const Flag& flag : flags_)
    any = any || (flag.required && flag.option->count() > 0 && !flag.text.empty());
  if (!any) throw CLI::CallForHelp();
  for (const Flag& flag : flags_) {
    if (flag.required && (flag.option->count() == 0 || flag.text.empty()))
      throw_input_error("{} is required (see --help)", flag.flag);
  }
}

}  // namespace headwise::cli
