// The DuoAttention baseline's gate training on a planted model: the head that retrieves from
// far back keeps its gate, heads that only look nearby are pushed to streaming by the penalty.
#include <catch2/catch.hpp>

#include "../calib/toy_model.hpp"
#include "headwise/core/error.hpp"
#include "headwise/eval/duo_attention.hpp"

using namespace headwise;
using test::HeadRole;

namespace {

std::vector<eval::EvalSample> toy_samples(int64_t count, uint64_t seed) {
  std::vector<eval::EvalSample> out;
  for (const auto& seq : test::toy_sequences(count, 48, seed)) {
    out.push_back({"toy", std::vector<int64_t>(seq.begin(), seq.end() - 1), {seq.back()}, {}});
  }
  return out;
}

}  // namespace

TEST_CASE("duo gates: the far head keeps its gate, local heads drop to streaming", "[eval]") {
  const std::vector<test::ToyHead> layer{{HeadRole::kLocal}, {HeadRole::kFar}, {HeadRole::kLocal}};
  test::ToyModel model({layer, layer});
  eval::DuoTrainingOptions o;
  o.steps = 120;
  // The toy's samples are 48 tokens: the published 128 sinks would keep all of them (below).
  o.streaming_window = 4;
  o.sink_tokens = 0;
  const auto trained = eval::train_duo_gates(model, toy_samples(3, 5), o);
  REQUIRE(trained.step_loss.size() == 120);
  CHECK(trained.step_loss.back() < trained.step_loss.front());
  for (const auto& [layer_id, gates] : trained.gates) {
    INFO("layer " << layer_id << " gates " << gates[0] << ", " << gates[1] << ", " << gates[2]);
    REQUIRE(gates.size() == 3);
    CHECK(gates[1] > 0.9);
    CHECK(gates[0] < 0.1);
    CHECK(gates[2] < 0.1);
  }
  // Deterministic: the same samples and options give the same gates.
  CHECK(eval::train_duo_gates(model, toy_samples(3, 5), o).gates == trained.gates);

  // Streaming heads keep their sink tokens: with the published 128, which cover the whole sample,
  // streaming equals full attention, nothing is left to distil and the penalty alone drives every
  // gate, the far head's too, to 0.
  o.sink_tokens = 128;
  for (const auto& [layer_id, gates] : eval::train_duo_gates(model, toy_samples(3, 5), o).gates) {
    INFO("layer " << layer_id << " gates " << gates[0] << ", " << gates[1] << ", " << gates[2]);
    for (double g : gates) CHECK(g < 0.1);
  }
}

TEST_CASE("duo gate training refuses what it cannot train on", "[eval]") {
  test::ToyModel model({{{HeadRole::kFar}}});
  eval::DuoTrainingOptions o;
  CHECK_THROWS_AS(eval::train_duo_gates(model, {}, o), InputError);
  o.steps = 0;
  CHECK_THROWS_AS(eval::train_duo_gates(model, toy_samples(1, 1), o), InputError);
  o.steps = 2;
  o.streaming_window = 0;
  CHECK_THROWS_AS(eval::train_duo_gates(model, toy_samples(1, 1), o), InputError);
}
