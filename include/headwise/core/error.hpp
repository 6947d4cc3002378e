#pragma once
// Typed errors. The library throws; `main` catches once, prints one line, exits non-zero.
// Messages name the file, tensor, field or flag at fault and, where possible, how to fix it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace headwise {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The user's input is wrong: a flag, a file, a field, a tensor.
class InputError : public Error {
 public:
  using Error::Error;
};

// The input is well-formed but asks for something headwise does not support.
class UnsupportedError : public InputError {
 public:
  using InputError::InputError;
};

// The request cannot be met (budget too small, memory will not fit).
class InfeasibleError : public Error {
 public:
  using Error::Error;
};

// Numerical failure at run time (NaN/Inf), with the layer and head that produced it.
class NumericError : public Error {
 public:
  using Error::Error;
};

// Request fields by a stable id ("budget", "seq_len": the option's name in snake case), so the
// library need not know how a front end spells them. A message names a field with field_ref();
// the front end renders it with its own names (the CLI: cli/flag_names.cpp). what() spells every
// field as the command line's option convention (seq_len: --seq-len), so a message reads the
// same wherever it is shown and library callers without a front end still see option names.
using FieldNamer = std::function<std::string(std::string_view field)>;

// "seq_len" -> "--seq-len": the default spelling of a field, what() uses.
std::string option_spelling(std::string_view field);

// A placeholder for `field` inside a message text; render() replaces it by the field's name.
std::string field_ref(std::string_view field);

// The part of an error that names fields: the field at fault and the text with references.
class FieldMessage {
 public:
  FieldMessage(std::string field, std::string text)
      : field_(std::move(field)), text_(std::move(text)) {}
  virtual ~FieldMessage() = default;
  const std::string& field() const { return field_; }
  // The message with each referenced field named by `name`.
  std::string render(const FieldNamer& name) const;

 protected:
  const std::string& text() const { return text_; }

 private:
  std::string field_;
  std::string text_;
};

// Bad input in one field of a request.
class FieldError : public InputError, public FieldMessage {
 public:
  FieldError(std::string field, std::string text);
  // The same error with `prefix` (which may hold field references) before its text: a caller
  // that knows where the request came from (a manifest entry) says so and keeps the field.
  FieldError prefixed(std::string_view prefix) const;
};

// A request that cannot be met, caused by one field (a budget below the minimum).
class InfeasibleFieldError : public InfeasibleError, public FieldMessage {
 public:
  InfeasibleFieldError(std::string field, std::string text);
};

// Throws a FieldError whose message starts with the field's name: `detail` follows it directly
// (" must be positive", ": cannot parse"); other fields in it are field_ref() arguments.
template <typename... Args>
[[noreturn]] void throw_field_error(std::string_view field, fmt::format_string<Args...> detail,
                                    Args&&... args) {
  throw FieldError(std::string(field),
                   field_ref(field) + fmt::format(detail, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void throw_input_error(fmt::format_string<Args...> format, Args&&... args) {
  throw InputError(fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void throw_unsupported(fmt::format_string<Args...> format, Args&&... args) {
  throw UnsupportedError(fmt::format(format, std::forward<Args>(args)...));
}

// For our own invariants: a failure here is a headwise bug, not bad input.
#define HEADWISE_CHECK(cond, ...)                                                            \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      throw ::headwise::Error(fmt::format("internal error at {}:{}: {}", __FILE__, __LINE__, \
                                          fmt::format(__VA_ARGS__)));                        \
    }                                                                                        \
  } while (0)

}  // namespace headwise
