// Fuzzes config.json → ModelSpec (arch::build_model_spec over every registered architecture;
// the seed corpus holds one config per architecture). An accepted spec must be usable by the
// memory model: every attention layer has positive, groupable head counts.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string_view>

#include "fuzz_common.hpp"
#include "headwise/arch/registry.hpp"
#include "headwise/core/files.hpp"
#include "headwise/core/json.hpp"
#include "headwise/memory/memory_model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace headwise;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_accept_or_input_error([&] {
    // What load_model_spec does with config.json: read_json_file's parser, then the builder.
    const nlohmann::json config = parse_json(text, "fuzz/config.json");
    const arch::ModelSpec spec = arch::build_model_spec(config, "fuzz/config.json");
    for (const auto& layer : spec.layers) {
      if (!layer.attention) continue;
      const auto& att = *layer.attention;
      if (att.num_heads <= 0 || att.num_kv_heads <= 0 || att.head_dim <= 0)
        fuzz::fail("accepted non-positive heads");
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
