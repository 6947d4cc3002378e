#pragma once
// Field access for tokenizer.json with errors that name the file, the JSON path and the field.
#include <nlohmann/json.hpp>

#include <string>

#include "headwise/core/error.hpp"

namespace headwise::tokenize {

inline const nlohmann::json& require_field(const nlohmann::json& object, const char* field,
                                           const std::string& where) {
  if (!object.is_object() || !object.contains(field))
    throw_input_error("{}: missing field '{}'", where, field);
  return object.at(field);
}

inline std::string require_string(const nlohmann::json& object, const char* field,
                                  const std::string& where) {
  const auto& value = require_field(object, field, where);
  if (!value.is_string()) throw_input_error("{}: field '{}' must be a string", where, field);
  return value.get<std::string>();
}

inline const nlohmann::json& require_array(const nlohmann::json& object, const char* field,
                                           const std::string& where) {
  const auto& value = require_field(object, field, where);
  if (!value.is_array()) throw_input_error("{}: field '{}' must be a list", where, field);
  return value;
}

// An optional string field that may also be JSON null.
inline std::string optional_string(const nlohmann::json& object, const char* field,
                                   const std::string& where) {
  if (!object.contains(field) || object.at(field).is_null()) return {};
  if (!object.at(field).is_string())
    throw_input_error("{}: field '{}' must be a string or null", where, field);
  return object.at(field).get<std::string>();
}

}  // namespace headwise::tokenize
