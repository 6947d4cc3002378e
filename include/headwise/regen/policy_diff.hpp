#pragma once
// A readable account of how a committed policy differs from a freshly produced one, for
// `regen --check`: serving shape, provenance keys, and per layer/KV head the window and the
// head's cache bytes before and after, then the totals.
#include <string>
#include <vector>

#include "headwise/arch/model_spec.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::regen {

// One line per difference (empty when the policies are equal field by field). `spec` is the
// model both were made for, used to price windows in bytes.
std::vector<std::string> diff_policies(const policy::Policy& committed,
                                       const policy::Policy& produced, const arch::ModelSpec& spec);

// First line where two texts differ, as "line N: '<a>' → '<b>'" (for differences the field
// comparison cannot name, e.g. a hand edit of layout only).
std::string first_text_difference(const std::string& committed, const std::string& produced);

}  // namespace headwise::regen
