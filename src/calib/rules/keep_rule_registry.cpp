// The keep rules' methods by name (keep_rule_method.hpp).
#include <algorithm>
#include <map>

#include "headwise/calib/keep_rule_method.hpp"
#include "headwise/core/error.hpp"

namespace headwise::calib {
namespace {

// A function-local map: rules register from other files' static initialisers, in any order.
std::map<std::string, std::unique_ptr<KeepRuleMethod>>& methods() {
  static std::map<std::string, std::unique_ptr<KeepRuleMethod>> by_name;
  return by_name;
}

}  // namespace

RegisterKeepRule::RegisterKeepRule(std::unique_ptr<KeepRuleMethod> method) {
  HEADWISE_CHECK(method != nullptr, "RegisterKeepRule: no method");
  const std::string name = method->name();
  const auto& known = policy::keep_rule_names();
  // window and h2o are the policy format's own names; every other rule adds its name.
  if (std::find(known.begin(), known.end(), name) == known.end()) {
    policy::register_keep_rule_name(name);
  }
  HEADWISE_CHECK(methods().emplace(name, std::move(method)).second, "keep rule {} registered twice",
                 name);
}

const KeepRuleMethod& keep_rule_method(const policy::KeepRule& rule) {
  const auto it = methods().find(rule.name());
  HEADWISE_CHECK(it != methods().end(), "keep rule {} has no calibration method", rule.name());
  return *it->second;
}

}  // namespace headwise::calib
