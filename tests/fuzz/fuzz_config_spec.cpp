// Fuzzes config.json → ModelSpec (arch::build_model_spec over every registered architecture;
// the seed corpus holds one config per architecture). An accepted spec must be usable by the
// memory model: every attention layer has positive, groupable head counts.
#include <nlohmann/json.hpp>

#include <cstdint>

#include "fuzz_common.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/memory/memory_model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace headwise;
  // JSON syntax errors are read_json_file's job (covered by its tests); fuzz what follows.
  const nlohmann::json config = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return 0;
  fuzz::expect_accept_or_input_error([&] {
    const arch::ModelSpec spec = arch::build_model_spec(config, "fuzz/config.json");
    for (const auto& layer : spec.layers) {
      if (!layer.attention) continue;
      const auto& att = *layer.attention;
      if (att.num_heads <= 0 || att.num_kv_heads <= 0 || att.head_dim <= 0) fuzz::fail("accepted non-positive heads");
    }
    // What every command does next with a spec: the full-KV memory estimate.
    memory::MemoryOptions options;
    options.context = 4096;
    options.kv_dtype = spec.dtype;
    memory::validate_options(options);
    (void)memory::fixed_bytes(spec, options);
  });
  return 0;
}
