// Layer streaming: prefetched weights, released layers and dropped mapped pages must not
// change what the model computes.
#include <catch2/catch.hpp>

#include <c10/core/InferenceMode.h>

#include <filesystem>
#include <limits>

#include "../support/test_paths.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/arch/model.hpp"
#include "headwise/arch/registry.hpp"

using namespace headwise;

namespace {

std::filesystem::path fixture(const char* name) {
  return std::filesystem::path(HEADWISE_FIXTURES_DIR) / name;
}

at::Tensor run_layers(arch::DecoderModel& model, const at::Tensor& ids, bool prefetch,
                      bool release) {
  at::Tensor hidden = model.embed(ids);
  arch::ExactAttentionCore exact;
  for (int64_t i = 0; i < model.spec().num_layers(); ++i) {
    if (prefetch) model.prefetch_layer(i + 1);
    hidden = model.run_layer(i, hidden, {&exact, nullptr, 0});
    if (release) model.release_layer(i);
  }
  return hidden;
}

}  // namespace

TEST_CASE("prefetching and releasing layers leaves the model's outputs unchanged", "[arch]") {
  c10::InferenceMode inference;
  for (const char* name : {"qwen3_next_tiny", "llama_bias_tied", "gemma3_gqa4"}) {
    INFO(name);
    auto model = arch::load_model(fixture(name), {});
    at::manual_seed(3);
    const at::Tensor ids = at::randint(0, model->spec().vocab_size, {2, 40}, at::kLong);
    const at::Tensor plain = run_layers(*model, ids, /*prefetch=*/false, /*release=*/false);
    model->release_all();
    const at::Tensor streamed = run_layers(*model, ids, /*prefetch=*/true, /*release=*/true);
    CHECK(at::equal(plain, streamed));
    // Pages dropped on release fault back in from the file with the same bytes.
    const at::Tensor again = run_layers(*model, ids, /*prefetch=*/true, /*release=*/true);
    CHECK(at::equal(plain, again));
    // Every streamed layer was released: only the embeddings stay resident.
    model->release_all();
    (void)model->embed(ids);
    const int64_t embeddings = model->resident_weight_bytes();
    (void)run_layers(*model, ids, /*prefetch=*/true, /*release=*/true);
    CHECK(model->resident_weight_bytes() == embeddings);
  }
}

TEST_CASE("a prefetch that is never used is harmless", "[arch]") {
  c10::InferenceMode inference;
  auto model = arch::load_model(fixture("qwen3_next_tiny"), {});
  model->prefetch_layer(1);
  model->prefetch_layer(2);   // replaces the first request
  model->prefetch_layer(-1);  // out of range: ignored
  model->prefetch_layer(model->spec().num_layers());
  const at::Tensor ids = at::randint(0, model->spec().vocab_size, {1, 16}, at::kLong);
  const at::Tensor a = model->forward(ids);
  model->release_all();
  const at::Tensor b = model->forward(ids);
  CHECK(at::equal(a, b));
}

TEST_CASE("weights in their own mappings compute what heap copies do, released or not", "[arch]") {
  // The fixtures' weights are all under the default threshold: map every one.
  c10::InferenceMode inference;
  for (const char* name : {"qwen3_next_tiny", "gemma3_gqa4"}) {
    INFO(name);
    arch::ModelOptions heap;
    heap.own_mapping_min_bytes = std::numeric_limits<int64_t>::max();
    arch::ModelOptions mapped;
    mapped.own_mapping_min_bytes = 0;
    auto on_heap = arch::load_model(fixture(name), heap);
    auto in_mappings = arch::load_model(fixture(name), mapped);
    at::manual_seed(5);
    const at::Tensor ids = at::randint(0, on_heap->spec().vocab_size, {2, 24}, at::kLong);
    const at::Tensor expected = run_layers(*on_heap, ids, /*prefetch=*/false, /*release=*/false);
    CHECK(at::equal(run_layers(*in_mappings, ids, /*prefetch=*/true, /*release=*/true), expected));
    CHECK(
        at::equal(run_layers(*in_mappings, ids, /*prefetch=*/false, /*release=*/false), expected));
    in_mappings->release_all();
    CHECK(in_mappings->resident_weight_bytes() == 0);
  }
}
