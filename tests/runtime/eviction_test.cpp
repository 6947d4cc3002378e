// Online eviction (SnapKV, H2O, AdaKV) in the runtime decoder: the KV bytes equal the policy's
// estimate to the byte, no head ever holds more than its slots, a capacity covering the
// sequence is full KV, and each selection rule on hand-checkable cases.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include "../arch/fixture_reference.hpp"
#include "../calib/toy_model.hpp"
#include "headwise/core/error.hpp"
#include "headwise/runtime/decoder.hpp"

using namespace headwise;
using headwise::testing::fixture_dir;
using headwise::testing::windows_by_head;
using runtime::EvictionMethod;

namespace {

constexpr int64_t kBatch = 2;
constexpr int64_t kPrompt = 40;
constexpr int64_t kDecode = 4;

const std::vector<EvictionMethod> kMethods{EvictionMethod::kSnapKV, EvictionMethod::kH2O,
                                           EvictionMethod::kAdaKV};

runtime::EvictionOptions eviction(
    EvictionMethod method,
    runtime::EvictionPrefill prefill = runtime::EvictionPrefill::kWholePrompt) {
  runtime::EvictionOptions o;
  o.method = method;
  o.observation_window = 6;  // shorter than the prompt, longer than a chunk: staged across chunks
  o.prefill = prefill;
  return o;
}

// Every configuration eval runs: SnapKV, H2O, AdaKV, and SnapKV/AdaKV compressing per chunk.
std::vector<runtime::EvictionOptions> all_configurations() {
  std::vector<runtime::EvictionOptions> out;
  for (auto method : kMethods) out.push_back(eviction(method));
  out.push_back(eviction(EvictionMethod::kSnapKV, runtime::EvictionPrefill::kEachChunk));
  out.push_back(eviction(EvictionMethod::kAdaKV, runtime::EvictionPrefill::kEachChunk));
  return out;
}

bool bounded_prefill(const runtime::EvictionOptions& o) {
  return o.method == EvictionMethod::kH2O || o.prefill == runtime::EvictionPrefill::kEachChunk;
}

at::Tensor random_ids(int64_t vocab, int64_t steps, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randint(vocab, {kBatch, steps}, gen, at::TensorOptions().dtype(at::kLong));
}

memory::MemoryOptions options_for(const arch::ModelSpec& spec, int64_t context, int64_t block,
                                  int64_t sinks) {
  memory::MemoryOptions o;
  o.context = context;
  o.batch = kBatch;
  o.block_size = block;
  o.sink_tokens = sinks;
  o.kv_dtype = spec.dtype;
  return o;
}

// Prefill in `chunk`-token chunks, then decode the rest token by token: logits [B, T, V].
at::Tensor run(runtime::Decoder& decoder, const at::Tensor& ids, int64_t prompt, int64_t chunk) {
  decoder.reset();
  std::vector<at::Tensor> parts{decoder.prefill(ids.slice(1, 0, prompt), chunk)};
  for (int64_t t = prompt; t < ids.size(1); ++t)
    parts.push_back(decoder.decode_step(ids.select(1, t)).unsqueeze(1));
  return at::cat(parts, 1);
}

// Every head holds at most its region; SnapKV/H2O regions are the capacities, AdaKV's sum to
// them per layer. `full`: every region is filled (the sequence is longer than every capacity).
void check_within_capacity(const runtime::EvictionCache& cache, EvictionMethod method, bool full) {
  for (const auto& [id, layer] : cache.layers()) {
    for (int64_t b = 0; b < kBatch; ++b) {
      int64_t regions = 0;
      for (int64_t h = 0; h < layer.num_kv_heads; ++h) {
        const int64_t held = static_cast<int64_t>(cache.held_positions(id, b, h).size());
        const int64_t region = cache.region_length(id, b, h);
        INFO("layer " << id << " seq " << b << " head " << h << " held " << held << " region "
                      << region);
        CHECK(held <= region);
        if (full) CHECK(held == region);
        if (method != EvictionMethod::kAdaKV)
          CHECK(region == layer.capacity[static_cast<size_t>(h)]);
        regions += region;
      }
      CHECK(regions == std::accumulate(layer.capacity.begin(), layer.capacity.end(), int64_t{0}));
    }
  }
}

// A single-layer toy spec with `heads` KV heads (one query head each), head_dim 16.
arch::ModelSpec toy_layer(size_t heads) {
  return test::toy_spec({std::vector<test::ToyHead>(heads, test::ToyHead{test::HeadRole::kLocal})});
}

// Attention inputs at layer 0 for queries/keys given per head as [heads, T, 16] (values: one-hot
// positions, unused by the checks).
arch::AttentionInputs toy_inputs(const at::Tensor& q, const at::Tensor& k, int64_t offset) {
  arch::AttentionInputs in;
  in.layer_id = 0;
  in.q = q.unsqueeze(0);
  in.k = k.unsqueeze(0);
  in.v = at::zeros_like(in.k);
  in.scaling = 1.0;
  in.position_offset = offset;
  return in;
}

std::vector<int64_t> vec(std::initializer_list<int64_t> v) {
  return v;
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

}  // namespace

TEST_CASE(
    "eviction decoders hold exactly the estimated bytes and never more than each head's slots",
    "[runtime]") {
  c10::InferenceMode inference;
  for (const auto& name : {"qwen3_next_tiny", "gemma3_gqa4", "qwen3_gqa"}) {
    auto model = arch::load_model(fixture_dir(name), arch::ModelOptions{});
    const auto& spec = model->spec();
    // Binding: slots round_up(min(w + 2, 64), 4) = 8 and 16 per head, for 44 tokens.
    const auto windows =
        windows_by_head(spec, [](int64_t, int64_t h) -> int64_t { return h % 2 == 0 ? 5 : 12; });
    const auto ids = random_ids(spec.vocab_size, kPrompt + kDecode, 3);
    for (auto kv : {DType::kFloat32, DType::kBFloat16}) {
      auto o = options_for(spec, 64, 4, 2);
      o.kv_dtype = kv;
      const auto estimate = memory::estimate(spec, windows, o);
      for (const auto& config : all_configurations()) {
        const auto method = config.method;
        INFO(name << " " << runtime::eviction_name(config) << " kv " << dtype_name(kv));
        runtime::Decoder decoder(*model, windows, o, config);
        const auto* cache = decoder.eviction_cache();
        REQUIRE(cache != nullptr);
        CHECK(decoder.cache_bytes() == estimate.total_bytes);
        CHECK(cache->kv_bytes() == estimate.components.global_kv_bytes);
        decoder.reset();
        // H2O and the chunked variants are bounded throughout the prefill: check after every
        // chunk (separate prefill calls), and inside the calls with chunks of 3.
        for (int64_t t0 = 0; t0 < kPrompt; t0 += 8) {
          decoder.prefill(ids.slice(1, t0, t0 + 8), bounded_prefill(config) ? 3 : 8);
          check_within_capacity(*cache, method, t0 + 8 > 16);
        }
        for (int64_t t = kPrompt; t < kPrompt + kDecode; ++t) {
          decoder.decode_step(ids.select(1, t));
          check_within_capacity(*cache, method, true);
        }
        CHECK(decoder.cache_bytes() == estimate.total_bytes);
        CHECK(cache->auxiliary_bytes() > 0);
        // SnapKV/AdaKV stage a prompt's K/V before compressing; chunked, nothing is staged
        // (a chunk's own keys are activations, as for every method); H2O never stages.
        CHECK((cache->peak_staged_bytes() > 0) == !bounded_prefill(config));
        CHECK(cache->staged_bytes() == 0);
      }
    }
  }
}

TEST_CASE("eviction with slots covering the sequence is full KV", "[runtime]") {
  c10::InferenceMode inference;
  for (const auto& name :
       {"qwen3_next_tiny", "gemma3_gqa4", "gemma3_softcap", "qwen3_gqa", "gpt_oss_tiny"}) {
    auto model = arch::load_model(fixture_dir(name), arch::ModelOptions{});
    const auto& spec = model->spec();
    const auto ids = random_ids(spec.vocab_size, kPrompt + kDecode, 7);
    const auto o = options_for(spec, 100, 16, 0);
    runtime::Decoder full(*model, memory::full_kv_windows(spec), o);
    const at::Tensor reference = run(full, ids, kPrompt, 16);
    // Every head full, and finite windows no shorter than the sequence (sinks included).
    const auto long_windows =
        windows_by_head(spec, [](int64_t, int64_t h) -> int64_t { return h == 0 ? 44 : 60; });
    for (const auto& [label, windows] :
         {std::pair{"full", memory::full_kv_windows(spec)}, std::pair{"long", long_windows}}) {
      for (const auto& config : all_configurations()) {
        runtime::Decoder decoder(*model, windows, o, config);
        for (int64_t chunk : {1, 16}) {
          const auto err = headwise::testing::compare(run(decoder, ids, kPrompt, chunk), reference);
          INFO(name << " " << label << " " << runtime::eviction_name(config) << " chunk " << chunk
                    << ": max |diff| " << err.error << " (scale " << err.scale << ")");
          CHECK(err.error <= 1e-5 * err.scale);
        }
      }
    }
  }
}

// Every (global layer, KV head) of the spec for which `pick` says so.
std::set<std::pair<int64_t, int64_t>> heads_where(const arch::ModelSpec& spec,
                                                  const std::function<bool(int64_t)>& pick) {
  std::set<std::pair<int64_t, int64_t>> out;
  for (int64_t id : spec.global_layer_ids()) {
    for (int64_t h = 0; h < spec.layer(id).attention->num_kv_heads; ++h) {
      if (pick(h)) out.insert({id, h});
    }
  }
  return out;
}

TEST_CASE("window heads in the eviction cache keep exactly the grouped cache's window",
          "[runtime]") {
  c10::InferenceMode inference;
  for (const auto& name : {"qwen3_next_tiny", "gemma3_gqa4", "gpt_oss_tiny"}) {
    auto model = arch::load_model(fixture_dir(name), arch::ModelOptions{});
    const auto& spec = model->spec();
    const auto ids = random_ids(spec.vocab_size, kPrompt + kDecode, 11);
    // Binding windows with sinks and block padding: slots 8 and 16 for 44 tokens.
    const auto windows =
        windows_by_head(spec, [](int64_t, int64_t h) -> int64_t { return h % 2 == 0 ? 5 : 12; });
    const auto o = options_for(spec, 64, 4, 2);
    runtime::Decoder grouped(*model, windows, o);
    const at::Tensor reference = run(grouped, ids, kPrompt, 16);
    auto every_head = eviction(EvictionMethod::kH2O);
    every_head.window_heads = heads_where(spec, [](int64_t) { return true; });
    runtime::Decoder decoder(*model, windows, o, every_head);
    for (int64_t chunk : {1, 3, 16}) {
      const auto err = headwise::testing::compare(run(decoder, ids, kPrompt, chunk), reference);
      INFO(name << " chunk " << chunk << ": max |diff| " << err.error << " (scale " << err.scale
                << ")");
      CHECK(err.error <= 1e-5 * err.scale);
    }
    // Mixed: even heads keep their window (sinks 0, 1 and the last slots' positions), odd heads
    // choose by H2O and differ from the window run.
    auto mixed = eviction(EvictionMethod::kH2O);
    mixed.window_heads = heads_where(spec, [](int64_t h) { return h % 2 == 0; });
    runtime::Decoder mix(*model, windows, o, mixed);
    const at::Tensor logits = run(mix, ids, kPrompt, 3);
    const int64_t seen = kPrompt + kDecode;
    for (const auto& [id, layer] : mix.eviction_cache()->layers()) {
      for (int64_t h = 0; h < layer.num_kv_heads; ++h) {
        const auto held = mix.eviction_cache()->held_positions(id, 0, h);
        const int64_t slots = layer.capacity[static_cast<size_t>(h)];
        CHECK(static_cast<int64_t>(held.size()) == slots);
        if (h % 2 != 0) continue;
        std::vector<int64_t> expected{0, 1};
        for (int64_t p = seen - (slots - 2); p < seen; ++p) expected.push_back(p);
        INFO(name << " layer " << id << " head " << h);
        CHECK(held == expected);
      }
    }
    const auto err = headwise::testing::compare(logits, reference);
    CHECK(err.error > 1e-3 * err.scale);
  }
}

TEST_CASE(
    "keep_indices: the recent window, then scores, ties to the more recent; pooling as SnapKV's",
    "[runtime]") {
  const at::Tensor pos = at::tensor(vec({4, 0, 7, 1, 2, 3, 6, 5}));
  const at::Tensor score =
      at::tensor(std::vector<float>{0.2F, 0.5F, 0.0F, 9.0F, 0.2F, 0.2F, 0.0F, -1.0F});
  // recent 2 = positions 7, 6; then 9.0 (pos 1), 0.5 (pos 0), and of the 0.2 ties the most recent
  // (pos 4).
  CHECK(to_vector(pos.index_select(0, runtime::keep_indices(pos, score, 5, 2))) ==
        vec({0, 1, 4, 6, 7}));
  // No recent window: pure score order.
  CHECK(to_vector(pos.index_select(0, runtime::keep_indices(pos, score, 3, 0))) == vec({0, 1, 4}));
  // Fewer candidates than slots: all of them, by position.
  CHECK(to_vector(pos.index_select(0, runtime::keep_indices(pos, score, 9, 4))) ==
        vec({0, 1, 2, 3, 4, 5, 6, 7}));

  const at::Tensor s = at::tensor(std::vector<float>{0, 6, 0, 0, 0, 0, 3});
  CHECK(at::equal(runtime::pool_scores(s, 3, runtime::ScorePooling::kMax),
                  at::tensor(std::vector<float>{6, 6, 6, 0, 0, 3, 3})));
  CHECK(at::allclose(runtime::pool_scores(s, 3, runtime::ScorePooling::kAvg),
                     at::tensor(std::vector<float>{2, 2, 2, 0, 0, 1, 1})));
  CHECK(at::equal(runtime::pool_scores(s, 1, runtime::ScorePooling::kMax), s));
}

TEST_CASE("adakv_budgets: the floor first, then the layer's top scores flattened", "[runtime]") {
  const at::Tensor p = at::arange(6, at::kLong);
  const at::Tensor dominant = at::tensor(std::vector<float>{0.9F, 0.8F, 0.7F, 0.6F, 0.5F, 0.4F});
  const at::Tensor weak = at::tensor(std::vector<float>{0.1F, 0.1F, 0.05F, 0.0F, 0.0F, 0.0F});
  // Total 8, floor 1: the weak head keeps its floor, the dominant head takes the other 7 but has 6.
  CHECK(runtime::adakv_budgets({dominant, weak}, {p, p}, 8, 1) == vec({6, 2}));
  CHECK(runtime::adakv_budgets({dominant, weak}, {p, p}, 6, 1) == vec({5, 1}));
  // A higher floor protects the weak head more; the sum is always the total.
  CHECK(runtime::adakv_budgets({dominant, weak}, {p, p}, 6, 3) == vec({3, 3}));
  // Equal scores: ties go to the more recent position, then the lower head.
  const at::Tensor flat = at::zeros({6});
  CHECK(runtime::adakv_budgets({flat, flat}, {p, p}, 5, 0) == vec({3, 2}));
}

TEST_CASE("SnapKV and H2O keep a planted high-attention key and evict a low one", "[runtime]") {
  c10::InferenceMode inference;
  // One head, 16 prompt tokens. Every query is e0; key 3 is 8 e0 (attracts every later query),
  // key 5 is -8 e0 (repels), the rest 0. Capacity 4 (window 4, block 1, no sinks).
  constexpr int64_t kT = 16;
  at::Tensor q = at::zeros({1, kT, test::kToyHeadDim});
  q.select(2, 0).fill_(1.0);
  at::Tensor k = at::zeros({1, kT, test::kToyHeadDim});
  k[0][3][0] = 8.0;
  k[0][5][0] = -8.0;
  const auto spec = toy_layer(1);
  const memory::HeadWindows windows{{0, {4}}};

  SECTION("SnapKV: the observation window plus the best prefix keys") {
    auto o = eviction(EvictionMethod::kSnapKV);
    o.observation_window = 2;
    o.pooling_kernel = 1;
    auto cache = runtime::EvictionCache::allocate(spec, windows, test::toy_memory_options(32), o);
    runtime::EvictionAttentionCore core(cache, 5);
    core.begin_prompt(0, kT);
    core.attend(toy_inputs(q, k, 0));
    // Window {14, 15}; then key 3, then the most recent of the zero-score ties (13). Key 5 is out.
    CHECK(cache.held_positions(0, 0, 0) == vec({3, 13, 14, 15}));
    // Decoding: the new token displaces the lowest-scored prefix key (13), not key 3.
    core.attend(toy_inputs(q.slice(1, 0, 1), k.slice(1, 0, 1), kT));
    CHECK(cache.held_positions(0, 0, 0) == vec({3, 14, 15, 16}));
    // Max pooling (kernel 7, SnapKV's default) gives key 3's score to its neighbours 0..6, the
    // repelling key 5 included (SnapKV keeps clusters, not single keys); ties keep the most recent.
    o.pooling_kernel = 7;
    auto pooled = runtime::EvictionCache::allocate(spec, windows, test::toy_memory_options(32), o);
    runtime::EvictionAttentionCore pooled_core(pooled, 5);
    pooled_core.begin_prompt(0, kT);
    pooled_core.attend(toy_inputs(q, k, 0));
    CHECK(pooled.held_positions(0, 0, 0) == vec({5, 6, 14, 15}));
  }

  SECTION(
      "H2O: heavy hitters by accumulated attention plus the recent half, bounded token by token") {
    auto cache = runtime::EvictionCache::allocate(spec, windows, test::toy_memory_options(32),
                                                  eviction(EvictionMethod::kH2O));
    runtime::EvictionAttentionCore core(cache, 5);
    for (int64_t t = 0; t < kT; ++t) {
      core.attend(toy_inputs(q.slice(1, t, t + 1), k.slice(1, t, t + 1), t));
      CHECK(cache.held_positions(0, 0, 0).size() ==
            static_cast<size_t>(std::min<int64_t>(t + 1, 4)));
    }
    const auto held = cache.held_positions(0, 0, 0);
    // Recent {14, 15}; key 3 took almost all attention since it arrived; key 5 almost none.
    CHECK(std::count(held.begin(), held.end(), 3) == 1);
    CHECK(std::count(held.begin(), held.end(), 5) == 0);
    CHECK(held.back() == 15);
    CHECK(held[2] == 14);
  }
}

TEST_CASE(
    "AdaKV gives the head whose scores dominate more slots than its capacity, the total unchanged",
    "[runtime]") {
  c10::InferenceMode inference;
  // Two KV heads of capacity 8, prompt 16, window 2. Head 0's window queries attend to six
  // planted prefix keys; head 1's attend to their own window (its prefix scores are tiny).
  constexpr int64_t kT = 16;
  at::Tensor q = at::zeros({2, kT, test::kToyHeadDim});
  q.select(2, 0).fill_(1.0);
  at::Tensor k = at::zeros({2, kT, test::kToyHeadDim});
  const std::vector<int64_t> planted{1, 2, 4, 6, 8, 10};
  for (int64_t p : planted) k[0][p][0] = 6.0;
  for (int64_t p = 0; p < kT; ++p) k[1][p][0] = p >= kT - 2 ? 6.0 : -6.0;
  const auto spec = toy_layer(2);
  const memory::HeadWindows windows{{0, {8, 8}}};
  auto o = eviction(EvictionMethod::kAdaKV);
  o.observation_window = 2;
  o.pooling_kernel = 1;

  auto ada = runtime::EvictionCache::allocate(spec, windows, test::toy_memory_options(32), o);
  runtime::EvictionAttentionCore core(ada, 4);
  core.begin_prompt(0, kT);
  core.attend(toy_inputs(q, k, 0));
  // Prefix budget 16 - 2 x 2 = 12, mean 6, floor floor(0.2 x 6) = 1: head 1 keeps one prefix
  // key, head 0 the other 11 — every planted key among them.
  CHECK(ada.region_length(0, 0, 0) == 13);
  CHECK(ada.region_length(0, 0, 1) == 3);
  const auto held0 = ada.held_positions(0, 0, 0);
  CHECK(held0.size() == 13);
  for (int64_t p : planted) CHECK(std::count(held0.begin(), held0.end(), p) == 1);
  CHECK(ada.held_positions(0, 0, 1) == vec({13, 14, 15}));

  // SnapKV at the same slots keeps only 6 prefix keys per head: the planted ones, exactly.
  o.method = EvictionMethod::kSnapKV;
  auto snap = runtime::EvictionCache::allocate(spec, windows, test::toy_memory_options(32), o);
  runtime::EvictionAttentionCore snap_core(snap, 4);
  snap_core.begin_prompt(0, kT);
  snap_core.attend(toy_inputs(q, k, 0));
  CHECK(snap.held_positions(0, 0, 0) == vec({1, 2, 4, 6, 8, 10, 14, 15}));
  CHECK(snap.kv_bytes() == ada.kv_bytes());
}

TEST_CASE("eviction refuses bad parameters and windows with one clear line", "[runtime]") {
  const auto spec = toy_layer(2);
  const memory::HeadWindows windows{{0, {8, 8}}};
  const auto bad = [&](auto edit, const std::string& needle) {
    auto o = eviction(EvictionMethod::kSnapKV);
    edit(o);
    CHECK_THROWS_WITH(
        runtime::EvictionCache::allocate(spec, windows, test::toy_memory_options(32), o),
        Catch::Contains(needle));
  };
  bad([](auto& o) { o.observation_window = 0; }, "observation window must be positive");
  bad([](auto& o) { o.pooling_kernel = 4; }, "pooling kernel must be a positive odd number");
  bad([](auto& o) { o.adakv_floor = 1.5; }, "AdaKV floor must be a share in [0, 1]");
  const memory::HeadWindows one_head_missing{{0, {8}}};
  CHECK_THROWS_AS(
      runtime::EvictionCache::allocate(spec, one_head_missing, test::toy_memory_options(32),
                                       eviction(EvictionMethod::kH2O)),
      InputError);
}
