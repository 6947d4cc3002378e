// The resume hooks of run_seqcalib on the toy model: a run resumed from the state captured
// after any global layer decides exactly what an uninterrupted run decides, and the state
// survives its JSON form bit for bit.
#include <catch2/catch.hpp>

#include "headwise/calib/resume_checkpoint.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/core/window.hpp"
#include "toy_model.hpp"

using namespace headwise;
using test::HeadRole;

TEST_CASE("SeqCalib resumed from any layer's checkpoint equals the uninterrupted run", "[calib]") {
  const std::vector<test::ToyHead> layer{
      {HeadRole::kUniform}, {HeadRole::kFar}, {HeadRole::kLocal}};
  test::ToyModel model({layer, layer, layer});
  const auto seqs = test::toy_sequences(3, 96, 5);
  calib::SeqCalibOptions options;
  options.ladder = measure::parse_window_ladder("4,16,full", "--windows");
  options.head_bytes = [](const arch::LayerSpec&, int64_t window) {
    return window == kFullWindow ? 96 : window;
  };
  options.global_budget_bytes = 3 * (96 + 16 + 4);
  options.micro_batch = 2;
  std::vector<nlohmann::json> states;
  options.checkpoint = [&](const calib::ResumeCheckpoint& s) {
    states.push_back(calib::resume_checkpoint_to_json(s));
  };
  const auto whole = calib::run_seqcalib(model, seqs, options);
  REQUIRE(states.size() == 3);
  options.checkpoint = nullptr;
  for (const auto& json : states) {
    const calib::ResumeCheckpoint state =
        calib::resume_checkpoint_from_json(nlohmann::json::parse(json.dump()), "ckpt");
    CHECK(calib::resume_checkpoint_to_json(state) == json);
    options.resume = &state;
    const auto resumed = calib::run_seqcalib(model, seqs, options);
    CHECK(resumed.windows == whole.windows);
    CHECK(resumed.expected_distortion == whole.expected_distortion);
    REQUIRE(resumed.curves.size() == whole.curves.size());
    for (size_t i = 0; i < whole.curves.size(); ++i)
      CHECK(resumed.curves[i].distortion == whole.curves[i].distortion);
    CHECK(resumed.probe_lambda == whole.probe_lambda);
  }
}

TEST_CASE("a damaged checkpoint state is an InputError naming the file", "[calib]") {
  CHECK_THROWS_WITH(
      calib::resume_checkpoint_from_json(nlohmann::json::object(), "p.yaml.ckpt.json"),
      Catch::Contains("p.yaml.ckpt.json") && Catch::Contains("damaged checkpoint"));
}
