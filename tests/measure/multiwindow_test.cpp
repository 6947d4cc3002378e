#include <catch2/catch.hpp>

#include "headwise/arch/attention.hpp"
#include "headwise/core/error.hpp"
#include "headwise/measure/multiwindow.hpp"

using namespace headwise;

namespace {

arch::AttentionInputs random_inputs(int64_t batch, int64_t heads, int64_t kv, int64_t steps,
                                    int64_t hd, bool gated, uint64_t seed) {
  at::manual_seed(seed);
  arch::AttentionInputs in;
  in.q = at::randn({batch, heads, steps, hd}) * 2.0;
  in.k = at::randn({batch, kv, steps, hd}) * 2.0;
  in.v = at::randn({batch, kv, steps, hd});
  in.scaling = 1.0 / std::sqrt(static_cast<double>(hd));
  in.o_proj_weight = at::randn({24, heads * hd}) * 0.1;
  if (gated) in.output_gate = at::sigmoid(at::randn({batch, steps, heads, hd}));
  return in;
}

// Reference block output with only KV head `head` truncated to `window`.
at::Tensor block_output(const arch::AttentionInputs& in, const at::Tensor& attn) {
  at::Tensor a = in.output_gate.defined() ? attn * in.output_gate : attn;
  return at::matmul(a.flatten(2), in.o_proj_weight.t());
}

}  // namespace

TEST_CASE("one-pass multi-window attention equals masked attention at every level", "[measure]") {
  for (int64_t sinks : {0, 3}) {
    for (int64_t chunk : {7, 64}) {
      const auto in = random_inputs(2, 6, 2, 50, 8, false, 11 + sinks + chunk);
      const auto ladder = measure::parse_window_ladder("4,9,20,full", "test");
      const at::Tensor levels = measure::all_window_outputs(in, ladder, sinks, chunk);
      for (size_t l = 0; l < ladder.size(); ++l) {
        const at::Tensor expected =
            arch::windowed_attention(in, ladder.levels[l], sinks, /*chunk=*/1000);
        INFO("sinks " << sinks << " chunk " << chunk << " level " << l);
        CHECK((levels[static_cast<int64_t>(l)] - expected).abs().max().item<double>() < 1e-5);
      }
    }
  }
}

TEST_CASE("the one-pass levels include learned sink logits (gpt-oss) like masked attention",
          "[measure]") {
  auto in = random_inputs(2, 6, 2, 50, 8, false, 23);
  in.sink_logits = at::randn({6}) * 2.0;  // one per query head
  const auto ladder = measure::parse_window_ladder("4,9,20,full", "test");
  for (int64_t chunk : {7, 64}) {
    const at::Tensor levels = measure::all_window_outputs(in, ladder, 0, chunk);
    for (size_t l = 0; l < ladder.size(); ++l) {
      const at::Tensor expected = arch::windowed_attention(in, ladder.levels[l], 0, /*chunk=*/1000);
      INFO("chunk " << chunk << " level " << l);
      CHECK((levels[static_cast<int64_t>(l)] - expected).abs().max().item<double>() < 1e-5);
    }
  }
  // The sinks change the outputs (the test would pass without them otherwise).
  arch::AttentionInputs plain = in;
  plain.sink_logits = at::Tensor();
  CHECK((arch::windowed_attention(plain, 9, 0, 1000) - arch::windowed_attention(in, 9, 0, 1000))
            .abs()
            .max()
            .item<double>() > 1e-3);
}

TEST_CASE("a ladder without 'full' still measures against the untruncated output", "[measure]") {
  const auto in = random_inputs(1, 4, 2, 40, 8, true, 5);
  const auto ladder = measure::parse_window_ladder("8,16", "test");
  measure::DistortionAccumulator acc(2, 2);
  const at::Tensor full = measure::measure_window_distortion(in, ladder, 0, 16, acc);
  CHECK((full - arch::windowed_attention(in, kFullWindow, 0, 1000)).abs().max().item<double>() <
        1e-5);
  CHECK(acc.distortion(0, 0) >= acc.distortion(0, 1));
  CHECK(acc.distortion(0, 1) > 0);
}

TEST_CASE("measured distortion equals truncating one KV head at a time", "[measure]") {
  for (bool gated : {false, true}) {
    const int64_t kv = 3, heads = 6, steps = 37;
    const auto in = random_inputs(2, heads, kv, steps, 4, gated, 7);
    const auto ladder = measure::parse_window_ladder("2,5,11,full", "test");
    const int64_t sinks = 1;
    measure::DistortionAccumulator acc(kv, static_cast<int64_t>(ladder.size()));
    measure::measure_window_distortion(in, ladder, sinks, /*chunk=*/8, acc);

    const at::Tensor full_attn = arch::windowed_attention(in, kFullWindow, sinks, 1000);
    const at::Tensor y_full = block_output(in, full_attn);
    const double reference = y_full.to(at::kDouble).pow(2).sum().item<double>();
    for (int64_t h = 0; h < kv; ++h) {
      for (size_t l = 0; l < ladder.size(); ++l) {
        std::vector<int64_t> windows(kv, kFullWindow);
        windows[h] = ladder.levels[l];
        const at::Tensor y = block_output(in, arch::windowed_attention(in, windows, sinks, 1000));
        const double expected =
            (y - y_full).to(at::kDouble).pow(2).sum().item<double>() / reference;
        INFO("gated " << gated << " head " << h << " level " << l);
        CHECK(acc.distortion(h, static_cast<int64_t>(l)) ==
              Approx(expected).epsilon(1e-3).margin(1e-9));
      }
      CHECK(acc.distortion(h, 3) == 0.0);  // full
    }
  }
}

TEST_CASE("distortion accumulators merge independent of the split", "[measure]") {
  measure::DistortionAccumulator a(2, 2), b(2, 2), whole(2, 2);
  a.add_error(0, 1, 1e-3);
  a.add_reference(5.0, 10);
  b.add_error(0, 1, 2e-3);
  b.add_reference(7.0, 12);
  whole.add_error(0, 1, 1e-3);
  whole.add_error(0, 1, 2e-3);
  whole.add_reference(12.0, 22);
  a.merge(b);
  CHECK(a.distortion(0, 1) == Approx(whole.distortion(0, 1)));
  CHECK(a.tokens() == 22);
  a.add_error(1, 0, std::nan(""));
  CHECK_THROWS_AS(a.check_finite(4), NumericError);
}

TEST_CASE("window ladders parse strictly", "[measure]") {
  const auto ladder = measure::parse_window_ladder("1k,4k,16k,64k,full", "--windows");
  CHECK(ladder.levels == std::vector<int64_t>{1024, 4096, 16384, 65536, kFullWindow});
  CHECK(ladder.to_string() == "1k,4k,16k,64k,full");
  CHECK_THROWS_AS(measure::parse_window_ladder("4k,1k", "--windows"), InputError);
  CHECK_THROWS_AS(measure::parse_window_ladder("full,4k", "--windows"), InputError);
  CHECK_THROWS_AS(measure::parse_window_ladder("1k,,4k", "--windows"), InputError);
}
