#pragma once
// What fills a KV head's slots: its window (the most recent tokens, as the grouped cache keeps
// them), or tokens a rule selects in the same slots: heavy hitters by H2O's rule
// (runtime/eviction_cache.hpp), and whatever rule registers itself (calib/keep_rule_method.hpp).
// Files spell a rule by its name (`window`, `h2o`, ...).
//
// A rule is a name, not an enum: a new rule registers its name and its calibration method in one
// file, and the policy format, its reader and the memory model take it as they take h2o. What a
// rule costs besides its slots follows from one fact: every rule but `window` chooses which
// tokens stay, so its layer holds the selection bookkeeping (memory::selection_bytes).
#include <compare>
#include <string>
#include <string_view>
#include <vector>

namespace headwise::policy {

class KeepRule {
 public:
  static const KeepRule kWindow;  // the most recent tokens
  static const KeepRule kH2O;     // heavy hitters by accumulated attention, plus recent tokens
  // The keys the prompt's last queries attend to most, chosen at the prompt's end (SnapKV's
  // selection per head, docs/keep-rules.md); registered by src/calib/rules/snap_rule.cpp.
  static const KeepRule kSnap;

  KeepRule() : name_("window") {}
  // A registered rule by name; InputError naming `key` (a flag, a file's key) for any other.
  static KeepRule from_name(std::string_view name, std::string_view key);

  const std::string& name() const { return name_; }
  // True for every rule but window: the layer pays memory::selection_bytes for it.
  bool selects_tokens() const { return name_ != "window"; }

  friend bool operator==(const KeepRule&, const KeepRule&) = default;
  friend std::strong_ordering operator<=>(const KeepRule& a, const KeepRule& b) {
    return a.name_ <=> b.name_;
  }

 private:
  explicit KeepRule(std::string name) : name_(std::move(name)) {}
  std::string name_;
};

inline const KeepRule KeepRule::kWindow{"window"};
inline const KeepRule KeepRule::kH2O{"h2o"};
inline const KeepRule KeepRule::kSnap{"snap"};

// The rule names files and flags may use, in registration order: window, h2o, then the rules
// registered after them. A second registration of a name is an InternalError.
const std::vector<std::string>& keep_rule_names();
void register_keep_rule_name(std::string_view name);

// keep_rule_name(rule) = rule.name(); keep_rule_from_name = KeepRule::from_name.
std::string keep_rule_name(const KeepRule& rule);
KeepRule keep_rule_from_name(std::string_view name, std::string_view key);

}  // namespace headwise::policy
