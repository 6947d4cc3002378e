// The snap keep rule (docs/keep-rules.md) in the runtime decoder: a layer mixes window, h2o and
// snap heads; its bytes equal the estimate to the byte, its measured prefill peak equals
// memory::prefill_peak under both schedules, the two schedules give the same logits, and a
// needle outside every window is found by a snap head through the question alone.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <catch2/catch.hpp>

#include <algorithm>

#include "../arch/fixture_reference.hpp"
#include "../calib/toy_model.hpp"
#include "headwise/calib/keep_rule_method.hpp"
#include "headwise/core/error.hpp"
#include "headwise/memory/prefill_peak.hpp"
#include "headwise/policy/keep_rule.hpp"
#include "headwise/runtime/decoder.hpp"

using namespace headwise;
using headwise::testing::fixture_dir;
using headwise::testing::windows_by_head;

namespace {

constexpr int64_t kBatch = 2;
constexpr int64_t kPrompt = 40;
constexpr int64_t kDecode = 4;

at::Tensor random_ids(int64_t vocab, int64_t steps, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randint(vocab, {kBatch, steps}, gen, at::TensorOptions().dtype(at::kLong));
}

// Head h of the i-th global layer keeps by rule (i + h) % 3: snap, h2o, window. Every global
// layer selects; with two KV heads each rule appears beside each other rule.
runtime::EvictionOptions mixed_rules(const arch::ModelSpec& spec) {
  runtime::EvictionOptions o;
  o.method = runtime::EvictionMethod::kH2O;
  o.observation_window = 6;  // longer than a chunk of 4: observed across chunks
  const auto global = spec.global_layer_ids();
  for (size_t i = 0; i < global.size(); ++i) {
    for (int64_t h = 0; h < spec.layer(global[i]).attention->num_kv_heads; ++h) {
      const auto rule = (static_cast<int64_t>(i) + h) % 3;
      if (rule == 0) o.snap_heads.insert({global[i], h});
      if (rule == 2) o.window_heads.insert({global[i], h});
    }
  }
  return o;
}

memory::MemoryOptions options_for(const arch::ModelSpec& spec, DType kv) {
  memory::MemoryOptions o;
  o.context = 64;
  o.batch = kBatch;
  o.block_size = 4;
  o.sink_tokens = 1;
  o.kv_dtype = kv;
  (void)spec;
  return o;
}

// Prefill in `chunk`-token chunks, then decode the rest token by token: logits [B, T, V].
at::Tensor run(runtime::Decoder& decoder, const at::Tensor& ids, int64_t chunk) {
  decoder.reset();
  std::vector<at::Tensor> parts{decoder.prefill(ids.slice(1, 0, kPrompt), chunk)};
  for (int64_t t = kPrompt; t < ids.size(1); ++t)
    parts.push_back(decoder.decode_step(ids.select(1, t)).unsqueeze(1));
  return at::cat(parts, 1);
}

}  // namespace

TEST_CASE("snap heads beside window and h2o heads: bytes and prefill peaks equal the estimate",
          "[runtime]") {
  c10::InferenceMode inference;
  for (const auto& name : {"qwen3_next_tiny", "gemma3_gqa4", "gpt_oss_tiny"}) {
    auto model = arch::load_model(fixture_dir(name), arch::ModelOptions{});
    const auto& spec = model->spec();
    const auto ids = random_ids(spec.vocab_size, kPrompt + kDecode, 5);
    // Slots 8 and 16 (window + 1 sink, blocks of 4) for a 40-token prompt: every head evicts.
    const auto windows =
        windows_by_head(spec, [](int64_t, int64_t h) -> int64_t { return h % 2 == 0 ? 7 : 13; });
    const auto eviction = mixed_rules(spec);
    for (auto kv : {DType::kFloat32, DType::kBFloat16}) {
      const auto o = options_for(spec, kv);
      const std::set<int64_t> selecting = runtime::evicted_layers(spec, eviction);
      const auto peak =
          memory::prefill_peak(spec, windows, o, selecting, eviction.snap_heads, kPrompt);
      std::set<int64_t> snap_layers;
      for (const auto& [id, h] : eviction.snap_heads) snap_layers.insert(id);
      REQUIRE(peak.layer_staging_bytes > 0);
      CHECK((peak.whole_staging_bytes > peak.layer_staging_bytes) == (snap_layers.size() > 1));
      CHECK(peak.decode_node_bytes == peak.steady_bytes);
      CHECK(peak.transfer_bytes_per_request * kBatch == peak.steady_bytes);
      REQUIRE_THROWS_WITH(
          memory::prefill_peak(spec, windows, o, selecting, eviction.snap_heads, o.context + 1),
          Catch::Contains("--prompt-tokens: the prompt must be 1..64 tokens"));
      at::Tensor logits[2];
      int i = 0;
      for (auto schedule :
           {runtime::PrefillSchedule::kWholePrompt, runtime::PrefillSchedule::kLayerByLayer}) {
        runtime::Decoder decoder(*model, windows, o, eviction);
        decoder.set_prefill_schedule(schedule);
        INFO(name << " kv " << dtype_name(kv) << " schedule " << i);
        CHECK(decoder.cache_bytes() + decoder.bookkeeping_bytes() == peak.steady_bytes);
        logits[i++] = run(decoder, ids, 4);
        // After prefill and decode the decoder holds the steady bytes, and nothing staged.
        CHECK(decoder.cache_bytes() + decoder.bookkeeping_bytes() == peak.steady_bytes);
        CHECK(decoder.eviction_cache()->staged_bytes() == 0);
        CHECK(decoder.peak_kv_bytes() == (schedule == runtime::PrefillSchedule::kWholePrompt
                                              ? peak.whole_prompt_peak_bytes
                                              : peak.layer_by_layer_peak_bytes));
        // Every head holds exactly its slots (the sequence is longer than every capacity).
        for (const auto& [id, layer] : decoder.eviction_cache()->layers()) {
          for (int64_t b = 0; b < kBatch; ++b) {
            for (int64_t h = 0; h < layer.num_kv_heads; ++h) {
              CHECK(
                  static_cast<int64_t>(decoder.eviction_cache()->held_positions(id, b, h).size()) ==
                  layer.capacity[static_cast<size_t>(h)]);
            }
          }
        }
      }
      // Same chunks through the same layers in another order: the same logits, bit for bit.
      CHECK(at::equal(logits[0], logits[1]));
    }
  }
}

TEST_CASE("the layer-by-layer schedule gives the grouped cache's logits bit for bit", "[runtime]") {
  c10::InferenceMode inference;
  for (const auto& name : {"qwen3_next_tiny", "qwen3_sliding", "bamba_tiny"}) {
    auto model = arch::load_model(fixture_dir(name), arch::ModelOptions{});
    const auto& spec = model->spec();
    const auto ids = random_ids(spec.vocab_size, kPrompt + kDecode, 9);
    const auto windows =
        windows_by_head(spec, [](int64_t, int64_t h) -> int64_t { return h == 0 ? 5 : 19; });
    const auto o = options_for(spec, DType::kFloat32);
    runtime::Decoder whole(*model, windows, o), layer(*model, windows, o);
    layer.set_prefill_schedule(runtime::PrefillSchedule::kLayerByLayer);
    INFO(name);
    CHECK(at::equal(run(whole, ids, 16), run(layer, ids, 16)));
    CHECK(whole.peak_kv_bytes() == memory::estimate(spec, windows, o).total_bytes);
  }
}

TEST_CASE("snap heads whose slots cover the sequence are full KV", "[runtime]") {
  c10::InferenceMode inference;
  auto model = arch::load_model(fixture_dir("qwen3_next_tiny"), arch::ModelOptions{});
  const auto& spec = model->spec();
  const auto ids = random_ids(spec.vocab_size, kPrompt + kDecode, 3);
  const auto windows = memory::full_kv_windows(spec);
  auto o = options_for(spec, DType::kFloat32);
  runtime::Decoder full(*model, windows, o);
  runtime::EvictionOptions every_snap;
  every_snap.method = runtime::EvictionMethod::kH2O;
  for (int64_t id : spec.global_layer_ids()) {
    for (int64_t h = 0; h < spec.layer(id).attention->num_kv_heads; ++h)
      every_snap.snap_heads.insert({id, h});
  }
  runtime::Decoder snap(*model, windows, o, every_snap);
  for (int64_t chunk : {3, 64}) {
    const auto err = headwise::testing::compare(run(snap, ids, chunk), run(full, ids, chunk));
    INFO("chunk " << chunk << ": max |diff| " << err.error << " (scale " << err.scale << ")");
    CHECK(err.error <= 1e-5 * err.scale);
  }
}

namespace {

// A needle that only the question finds. One layer, two KV heads with the same queries, keys
// and values: head 0 keeps by snap, head 1 by its window; both have 40 slots. The prompt has 200
// tokens; every key is 0 but the needle's at position 50 (8 e1), every value e3 but the needle's
// (10 e2). Queries are 0 (uniform attention) except the question, the last `question` prompt
// queries, which ask for the needle (e1). Returns the decode query's output e2 component per head
// (the needle's value read back) after the prompt, and the positions each head holds.
struct NeedleRun {
  double snap_read = 0, window_read = 0;
  std::vector<int64_t> snap_held, window_held;
};

NeedleRun run_needle(int64_t question, runtime::SnapDecode decode, int64_t decode_steps) {
  constexpr int64_t kT = 200, kNeedle = 50, kDim = test::kToyHeadDim;
  const auto spec = test::toy_spec({std::vector<test::ToyHead>(2, {test::HeadRole::kLocal})});
  at::Tensor q = at::zeros({2, kT + decode_steps, kDim});
  at::Tensor k = at::zeros({2, kT + decode_steps, kDim});
  at::Tensor v = at::zeros({2, kT + decode_steps, kDim});
  v.select(2, 3).fill_(1.0);
  k.select(1, kNeedle).select(1, 1).fill_(8.0);
  v.select(1, kNeedle).zero_();
  v.select(1, kNeedle).select(1, 2).fill_(10.0);
  if (question > 0) q.slice(1, kT - question, kT).select(2, 1).fill_(1.0);
  q.slice(1, kT, kT + decode_steps).select(2, 1).fill_(1.0);  // decoding asks again
  runtime::EvictionOptions o;
  o.method = runtime::EvictionMethod::kH2O;
  o.snap_heads = {{0, 0}};
  o.window_heads = {{0, 1}};
  o.snap_decode = decode;
  auto cache = runtime::EvictionCache::allocate(spec, {{0, {40, 40}}},
                                                test::toy_memory_options(kT + decode_steps), o);
  runtime::EvictionAttentionCore core(cache, 64);
  const auto inputs = [&](int64_t from, int64_t to) {
    arch::AttentionInputs in;
    in.layer_id = 0;
    in.q = q.slice(1, from, to).unsqueeze(0);
    in.k = k.slice(1, from, to).unsqueeze(0);
    in.v = v.slice(1, from, to).unsqueeze(0);
    in.scaling = 1.0;
    in.position_offset = from;
    return in;
  };
  core.begin_prompt(0, kT);
  for (int64_t t0 = 0; t0 < kT; t0 += 64) core.attend(inputs(t0, std::min(kT, t0 + 64)));
  core.end_prompt();
  at::Tensor out;
  for (int64_t t = kT; t < kT + decode_steps; ++t) out = core.attend(inputs(t, t + 1));
  NeedleRun r;
  r.snap_read = out[0][0][0][2].item<double>();
  r.window_read = out[0][0][1][2].item<double>();
  r.snap_held = cache.held_positions(0, 0, 0);
  r.window_held = cache.held_positions(0, 0, 1);
  return r;
}

bool holds(const std::vector<int64_t>& held, int64_t p) {
  return std::find(held.begin(), held.end(), p) != held.end();
}

}  // namespace

TEST_CASE(
    "a needle outside every window: the snap head finds it with the question, a window "
    "head does not",
    "[runtime]") {
  c10::InferenceMode inference;
  for (auto decode : {runtime::SnapDecode::kRecentRing, runtime::SnapDecode::kDisplaceLowest}) {
    const NeedleRun r = run_needle(/*question=*/32, decode, 1);
    INFO("snap reads " << r.snap_read << ", window reads " << r.window_read);
    CHECK(holds(r.snap_held, 50));
    CHECK_FALSE(holds(r.window_held, 50));
    // The needle's value dominates the snap head's output (10 x p_needle, p_needle ~ 0.99) and is
    // absent from the window head's.
    CHECK(r.snap_read > 9.0);
    CHECK(r.window_read == 0.0);
    CHECK(r.snap_held.size() == 40);
    if (decode != runtime::SnapDecode::kRecentRing) continue;
    // 8 prefix slots beside the 32-token observation window. Max pooling (kernel 7) gives the
    // needle's score to 47..53; ties go to the higher raw score (the needle first), then to the
    // lower position, and the eighth slot to the lowest of the equal rest (0). The decoded token
    // took the ring's oldest slot (168), not a prefix key.
    CHECK(std::vector<int64_t>(r.snap_held.begin(), r.snap_held.begin() + 9) ==
          std::vector<int64_t>{0, 47, 48, 49, 50, 51, 52, 53, 169});
  }
  // Without the question nothing points at the needle: every prefix key ties and the lowest
  // positions stay, so the snap head is as blind as the window head.
  const NeedleRun blind = run_needle(/*question=*/0, runtime::SnapDecode::kRecentRing, 1);
  CHECK_FALSE(holds(blind.snap_held, 50));
  CHECK(blind.snap_read == 0.0);
  // A long decode: the ring keeps the needle for good; displacing the lowest-scored key keeps it
  // until the 8 prefix slots are spent (the needle goes last of the prefix, after 8 steps).
  CHECK(run_needle(32, runtime::SnapDecode::kRecentRing, 50).snap_read > 9.0);
  const NeedleRun displaced = run_needle(32, runtime::SnapDecode::kDisplaceLowest, 50);
  CHECK_FALSE(holds(displaced.snap_held, 50));
}

TEST_CASE("the snap rule's calibration method runs the runtime's snap heads and needs a prompt end",
          "[runtime]") {
  c10::InferenceMode inference;
  const auto& rule = calib::keep_rule_method(policy::KeepRule::kSnap);
  CHECK(rule.name() == "snap");
  const auto& names = policy::keep_rule_names();
  CHECK(std::find(names.begin(), names.end(), "snap") != names.end());
  const auto spec = test::toy_spec({std::vector<test::ToyHead>(2, {test::HeadRole::kLocal})});
  at::Generator gen = at::detail::createCPUGenerator(7);
  arch::AttentionInputs in;
  in.layer_id = 0;
  in.q = at::randn({1, 2, 48, test::kToyHeadDim}, gen);
  in.k = at::randn({1, 2, 48, test::kToyHeadDim}, gen);
  in.v = at::randn({1, 2, 48, test::kToyHeadDim}, gen);
  in.scaling = 0.25;
  const auto memory = test::toy_memory_options(64);
  calib::KeepRuleContext context{spec, memory, 16, 32};
  REQUIRE_THROWS_WITH(rule.attend(context, in, {8, 8}, {0}),
                      Catch::Contains("keep rule snap: layer 0 needs the sequences' prompt end"));
  context.prompt_end = 40;
  const at::Tensor out = rule.attend(context, in, {8, 8}, {0});
  // The same as the runtime's eviction cache fed the prompt, then token by token.
  runtime::EvictionOptions o;
  o.method = runtime::EvictionMethod::kH2O;
  o.snap_heads = {{0, 0}};
  o.window_heads = {{0, 1}};
  auto cache = runtime::EvictionCache::allocate(spec, {{0, {8, 8}}}, memory, o);
  runtime::EvictionAttentionCore core(cache, 32);
  core.set_kernel(arch::AttentionKernel::kExplicit);
  core.begin_prompt(0, 40);
  std::vector<at::Tensor> parts;
  for (int64_t t0 = 0, n = 0; t0 < 48; t0 += n) {
    n = t0 < 40 ? std::min<int64_t>(16, 40 - t0) : 1;
    arch::AttentionInputs chunk = in;
    chunk.q = in.q.slice(2, t0, t0 + n);
    chunk.k = in.k.slice(2, t0, t0 + n);
    chunk.v = in.v.slice(2, t0, t0 + n);
    chunk.position_offset = t0;
    parts.push_back(core.attend(chunk));
    if (t0 + n == 40) core.end_prompt();
  }
  CHECK(at::equal(out, at::cat(parts, 1)));
}

TEST_CASE("a policy's snap heads become the runtime's snap heads; other rules stay refused",
          "[runtime]") {
  policy::Policy p;
  policy::LayerPolicy one;
  one.layer_id = 1;
  one.kv_head_windows = {64, 128, 256};
  one.kv_head_rules = {policy::KeepRule::from_name("snap", "kv_head_rules"), policy::KeepRule::kH2O,
                       policy::KeepRule::kWindow};
  policy::LayerPolicy three;
  three.layer_id = 3;
  three.kv_head_windows = {64, 64, 64};
  p.per_layer_policies = {one, three};
  const auto selection = runtime::policy_selection(p);
  REQUIRE(selection);
  CHECK(selection->method == runtime::EvictionMethod::kH2O);
  CHECK(selection->layers == std::set<int64_t>{1});
  CHECK(selection->snap_heads == std::set<std::pair<int64_t, int64_t>>{{1, 0}});
  CHECK(selection->window_heads == std::set<std::pair<int64_t, int64_t>>{{1, 2}});
  CHECK(selection->snap_decode == runtime::SnapDecode::kRecentRing);
  CHECK(p.heads_with_rule(policy::KeepRule::kSnap) == selection->snap_heads);
  // A snap head may not also keep its window.
  auto both = *selection;
  both.window_heads.insert({1, 0});
  REQUIRE_THROWS_WITH(runtime::validate_eviction_options(both),
                      Catch::Contains("head 0 of layer 1 is both a window head and a snap head"));
}
