// A keep rule added the way a new rule is added (calib/keep_rule_method.hpp): one class and one
// registration, here in a test file, with no change to the walk, the pass or the policy format.
// The pass tries the rule, measures it like h2o, keeps it where the answers gain, prices its
// bookkeeping; the policy file carries it; the runtime refuses to serve what it cannot.
#include <catch2/catch.hpp>

#include "headwise/arch/attention.hpp"
#include "headwise/calib/calibration_data.hpp"
#include "headwise/calib/keep_rule_method.hpp"
#include "headwise/calib/keep_rules.hpp"
#include "headwise/core/error.hpp"
#include "headwise/runtime/decoder.hpp"
#include "toy_keep_rule_options.hpp"
#include "toy_model.hpp"

using namespace headwise;
using test::HeadRole;

namespace {

constexpr int64_t kContext = 64;

// "prefix": a head keeps the first tokens its slots hold, like a cache of sinks only (the query
// also sees itself). It keeps position 0 where a window of the same slots loses it.
class PrefixRule final : public calib::KeepRuleMethod {
 public:
  std::string name() const override { return "prefix"; }

  at::Tensor attend(const calib::KeepRuleContext& c, const arch::AttentionInputs& in,
                    const std::vector<int64_t>& windows,
                    const std::set<int64_t>& heads) const override {
    at::Tensor out = arch::windowed_attention(in, windows, c.memory.sink_tokens, c.attention_chunk);
    const auto kv = static_cast<int64_t>(windows.size());
    const int64_t group = out.size(2) / kv;
    for (int64_t h : heads) {
      const int64_t slots = memory::global_head_slots(windows[static_cast<size_t>(h)], c.memory);
      const at::Tensor first =
          arch::windowed_attention(in, std::vector<int64_t>(kv, 1), slots - 1, c.attention_chunk);
      out.slice(2, h * group, (h + 1) * group).copy_(first.slice(2, h * group, (h + 1) * group));
    }
    return out;
  }
};

const calib::RegisterKeepRule kPrefix(std::make_unique<PrefixRule>());

policy::KeepRule prefix() {
  return policy::KeepRule::from_name("prefix", "test");
}

calib::KeepRuleOptions options_with(const arch::ModelSpec& spec,
                                    const std::map<int64_t, std::vector<int64_t>>& windows,
                                    std::vector<policy::KeepRule> rules) {
  return test::toy_keep_rule_options(spec, windows, kContext, 1 << 20, std::move(rules));
}

}  // namespace

TEST_CASE("a keep rule registered from a test is tried, measured and kept where it wins",
          "[calib]") {
  // Head 1 retrieves position 0 from every query (its needle); the others attend to themselves.
  test::ToyModel model(
      {{{HeadRole::kLocal}, {HeadRole::kFar, 0.05}, {HeadRole::kLocal}, {HeadRole::kLocal}}},
      test::ToyReadout{200.0});
  const auto seqs = test::toy_sequences(3, kContext, 5);
  const auto answers = calib::tail_answer_positions(seqs, 8);
  const std::map<int64_t, std::vector<int64_t>> windows{{0, {4, 4, 4, 4}}};

  SECTION("the new rule alone") {
    const auto o = options_with(model.spec(), windows, {prefix()});
    const auto r = calib::choose_keep_rules(model, seqs, answers, windows, o);
    const auto& layer = r.layers.front();
    CHECK(r.evaluations == 1 + 4);  // the windows, then each candidate once
    CHECK((r.rules.at(0)[1] == prefix()));
    for (size_t h : {0, 2, 3}) CHECK((r.rules.at(0)[h] == policy::KeepRule::kWindow));
    CHECK(layer.divergence_chosen < 0.5 * layer.divergence_windows);
    // Priced as every selecting rule: its layer holds the selection bookkeeping.
    const auto estimate = memory::estimate(model.spec(), r.windows, o.memory, {0});
    CHECK(layer.selection_bytes == estimate.components.selection_state_bytes);
    CHECK(layer.selection_bytes > 0);
    CHECK(calib::keep_rules_json(r)["layers"][0]["kv_head_rules"][1] == "prefix");
  }
  SECTION("beside h2o: each head tries both, the needle head takes a selecting rule") {
    const auto o = options_with(model.spec(), windows, {policy::KeepRule::kH2O, prefix()});
    const auto r = calib::choose_keep_rules(model, seqs, answers, windows, o);
    CHECK(r.evaluations == 1 + 4 * 2);
    CHECK(r.rules.at(0)[1].selects_tokens());
    for (size_t h : {0, 2, 3}) CHECK((r.rules.at(0)[h] == policy::KeepRule::kWindow));
    const auto alone = calib::choose_keep_rules(model, seqs, answers, windows,
                                                options_with(model.spec(), windows, {prefix()}));
    CHECK(r.layers.front().divergence_chosen <= alone.layers.front().divergence_chosen);
  }
}

TEST_CASE("a registered rule is a policy rule: written, read, priced, and refused by the runtime",
          "[calib]") {
  CHECK(std::find(policy::keep_rule_names().begin(), policy::keep_rule_names().end(), "prefix") !=
        policy::keep_rule_names().end());
  policy::Policy p;
  p.context = kContext;
  p.per_layer_policies.push_back({0, {4, 4}, {}, {prefix(), policy::KeepRule::kWindow}});
  CHECK(p.selects_tokens());
  CHECK(p.selecting_layers() == std::set<int64_t>{0});
  CHECK_THROWS_WITH(runtime::policy_selection(p),
                    Catch::Contains("layer 0 head 0") && Catch::Contains("prefix"));
  // The message lists every registered rule, the built-in ones first (snap registers from the
  // library, prefix from this file).
  CHECK_THROWS_WITH(policy::KeepRule::from_name("suffix", "--keep-rules"),
                    Catch::Contains("--keep-rules") && Catch::Contains("(window, h2o, ") &&
                        Catch::Contains("prefix)"));
  // --keep-rules takes it like h2o, and spells the list in registration order.
  CHECK((calib::parse_keep_rules("prefix,window,h2o") ==
         std::vector<policy::KeepRule>{policy::KeepRule::kH2O, prefix()}));
  CHECK(calib::resolve_keep_rules("prefix,window", calib::DistortionMeasure::kAnswerTvSpan) ==
        "window,prefix");
  // The registry refuses a second rule by a name already taken.
  CHECK_THROWS(calib::RegisterKeepRule(std::make_unique<PrefixRule>()));
}
