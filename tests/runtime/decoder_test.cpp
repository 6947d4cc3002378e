// Runtime parity: the decoder (chunked prefill + decode over the physically windowed grouped
// cache) reproduces the plain forward with every head full, and the masked-attention reference
// (calib::PolicyAttentionCore) with random per-head windows and sinks; the bytes it holds stay
// equal to memory::estimate through prefill and decode.
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <catch2/catch.hpp>

#include <random>

#include "../arch/fixture_reference.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/runtime/decoder.hpp"

using namespace headwise;
using headwise::testing::fixture_dir;
using headwise::testing::windows_by_head;

namespace {

// Every fixture whose architecture has a forward: hybrid (gated delta), sliding/global
// interleave with softcap, plain llama/qwen3 with and without sliding layers.
const std::vector<std::string> kFixtures{
    "qwen3_next_tiny", "qwen3_next_tiny_b",     "qwen3_5_text_tiny", "qwen3_5_text_tiny_b",
    "gemma3_gqa4",     "gemma3_softcap",        "llama_bias_tied",   "llama_rope3",
    "qwen3_gqa",       "qwen3_sliding",         "qwen3_yarn",        "qwen3_next_yarn",
    "gpt_oss_tiny",    "qwen3_5_moe_tiny",      "lfm2_tiny",         "bamba_tiny",
    "nemotron_h_tiny", "granitemoehybrid_tiny", "jamba_tiny",        "falcon_h1_tiny"};

constexpr int64_t kBatch = 2;
constexpr int64_t kSteps = 44;  // past every fixture's sliding window (<= 24), so rings wrap
constexpr int64_t kDecode = 4;  // tokens fed one by one after the prefill

at::Tensor random_ids(int64_t vocab, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randint(vocab, {kBatch, kSteps}, gen, at::TensorOptions().dtype(at::kLong));
}

// The masked reference: the layers in order with PolicyAttentionCore (windows as masks).
at::Tensor masked_reference(arch::DecoderModel& model, const at::Tensor& ids,
                            const memory::HeadWindows& windows, int64_t sinks) {
  c10::InferenceMode inference;
  calib::PolicyAttentionCore core(windows, sinks, 7);
  at::Tensor hidden = model.embed(ids);
  arch::LayerRun run;
  run.attention = &core;
  for (int64_t i = 0; i < model.spec().num_layers(); ++i) hidden = model.run_layer(i, hidden, run);
  return model.logits(hidden);
}

// Prefill the first kSteps - kDecode tokens in `chunk`-token chunks, then decode the rest.
at::Tensor decoder_logits(runtime::Decoder& decoder, const at::Tensor& ids, int64_t chunk) {
  decoder.reset();
  std::vector<at::Tensor> parts{decoder.prefill(ids.slice(1, 0, kSteps - kDecode), chunk)};
  for (int64_t t = kSteps - kDecode; t < kSteps; ++t)
    parts.push_back(decoder.decode_step(ids.select(1, t)).unsqueeze(1));
  return at::cat(parts, 1);
}

memory::MemoryOptions options_for(const arch::ModelSpec& spec, int64_t context, int64_t block,
                                  int64_t sinks) {
  memory::MemoryOptions o;
  o.context = context;
  o.batch = kBatch;
  o.block_size = block;
  o.sink_tokens = sinks;
  o.kv_dtype = spec.dtype;  // the fixtures' fp32: parity is then a pure algorithm check
  return o;
}

void check_close(const at::Tensor& ours, const at::Tensor& reference, const std::string& what) {
  const auto err = headwise::testing::compare(ours, reference);
  INFO(what << ": max |diff| " << err.error << " (scale " << err.scale << ")");
  CHECK(err.error <= 1e-4 * err.scale);
}

}  // namespace

TEST_CASE("decoder with every head full equals the plain forward on every fixture", "[runtime]") {
  for (const auto& name : kFixtures) {
    auto model = arch::load_model(fixture_dir(name), arch::ModelOptions{});
    const auto ids = random_ids(model->spec().vocab_size, 7);
    const at::Tensor reference = model->forward(ids);
    // Context exactly the sequence: full rings fill to their last slot; block 16 adds padding.
    runtime::Decoder decoder(*model, memory::full_kv_windows(model->spec()),
                             options_for(model->spec(), kSteps, 16, 0));
    for (int64_t chunk : std::vector<int64_t>{1, 3, 16, kSteps}) {
      check_close(decoder_logits(decoder, ids, chunk), reference,
                  name + " chunk " + std::to_string(chunk));
    }
  }
}

TEST_CASE("decoder with random per-head windows and sinks equals the masked reference",
          "[runtime]") {
  std::mt19937_64 rng(99);
  const std::vector<int64_t> levels{1, 2, 3, 5, 8, 13, kFullWindow};
  for (const auto& name : kFixtures) {
    auto model = arch::load_model(fixture_dir(name), arch::ModelOptions{});
    const auto& spec = model->spec();
    const auto ids = random_ids(spec.vocab_size, 11);
    for (int trial = 0; trial < 3; ++trial) {
      memory::HeadWindows windows;
      for (int64_t id : spec.global_layer_ids()) {
        for (int64_t h = 0; h < spec.layer(id).attention->num_kv_heads; ++h) {
          windows[id].push_back(
              levels[std::uniform_int_distribution<size_t>(0, levels.size() - 1)(rng)]);
        }
      }
      const int64_t sinks = std::vector<int64_t>{0, 2, 3}[static_cast<size_t>(trial)];
      // Trial 1 runs at a context of exactly the sequence (rings clipped to C - S).
      const int64_t context = trial == 1 ? kSteps : 100;
      const at::Tensor reference = masked_reference(*model, ids, windows, sinks);
      runtime::Decoder decoder(*model, windows,
                               options_for(spec, context, trial == 2 ? 1 : 16, sinks));
      // Chunks of 1 (pure decode), shorter than most rings, and longer than every ring.
      for (int64_t chunk : {1, 4, 29}) {
        check_close(decoder_logits(decoder, ids, chunk), reference,
                    fmt::format("{} trial {} sinks {} chunk {}", name, trial, sinks, chunk));
      }
    }
  }
}

TEST_CASE("decoder holds exactly the estimated bytes through prefill and decode", "[runtime]") {
  for (const auto& name : {"qwen3_next_tiny", "gemma3_gqa4", "qwen3_sliding", "gpt_oss_tiny",
                           "lfm2_tiny", "bamba_tiny", "nemotron_h_tiny", "jamba_tiny"}) {
    auto model = arch::load_model(fixture_dir(name), arch::ModelOptions{});
    const auto& spec = model->spec();
    const auto windows = windows_by_head(
        spec, [](int64_t, int64_t h) -> int64_t { return h == 0 ? kFullWindow : 3 + 5 * h; });
    for (auto kv : {DType::kFloat32, DType::kBFloat16}) {
      auto o = options_for(spec, 64, 16, 2);
      o.kv_dtype = kv;
      runtime::Decoder decoder(*model, windows, o);
      const int64_t estimated = memory::estimate(spec, windows, o).total_bytes;
      // Every buffer's address: serving must write into these, never into fresh tensors.
      std::vector<const void*> before;
      for (const auto& l : decoder.cache().layers()) {
        for (const auto& g : l.groups)
          before.insert(before.end(), {g.k.data_ptr(), g.v.data_ptr()});
        if (l.k.defined()) before.insert(before.end(), {l.k.data_ptr(), l.v.data_ptr()});
        for (const auto& [n, t] : l.states) before.push_back(t.data_ptr());
      }
      CHECK(decoder.cache().allocated_bytes() == estimated);
      decoder_logits(decoder, random_ids(spec.vocab_size, 3), 8);
      const at::Tensor more = decoder.generate(5);
      CHECK(more.sizes() == at::IntArrayRef{kBatch, 5});
      INFO(name << " kv " << dtype_name(kv));
      CHECK(decoder.position() == kSteps + 4);
      CHECK(decoder.cache().allocated_bytes() == estimated);
      std::vector<const void*> after;
      for (const auto& l : decoder.cache().layers()) {
        for (const auto& g : l.groups) after.insert(after.end(), {g.k.data_ptr(), g.v.data_ptr()});
        if (l.k.defined()) after.insert(after.end(), {l.k.data_ptr(), l.v.data_ptr()});
        for (const auto& [n, t] : l.states) after.push_back(t.data_ptr());
      }
      CHECK(after == before);
    }
  }
}

TEST_CASE("decoder refuses to run past the cache context", "[runtime]") {
  auto model = arch::load_model(fixture_dir("qwen3_gqa"), arch::ModelOptions{});
  runtime::Decoder decoder(*model, memory::full_kv_windows(model->spec()),
                           options_for(model->spec(), 10, 16, 0));
  CHECK_THROWS_WITH(decoder.prefill(random_ids(model->spec().vocab_size, 1).slice(1, 0, 11), 4),
                    Catch::Contains("exceeds the cache context of 10"));
}
