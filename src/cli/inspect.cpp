// `headwise-calc inspect`: what a model is, from config.json (and safetensors headers when
// present): layer kinds, heads, windows, states, weight bytes and full-KV cache bytes.
#include <iostream>

#include "headwise/arch/registry.hpp"
#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"
#include "headwise/core/window.hpp"
#include "headwise/io/checkpoint.hpp"
#include "headwise/memory/memory_model.hpp"

namespace headwise::cli {
namespace {

struct InspectArgs {
  std::string model;
  std::string context = "128k";
  int64_t batch = 1;
  int64_t block_size = 16;
  std::string kv_dtype;
  CommonFlags flags;
};

nlohmann::json layer_json(const arch::LayerSpec& layer, const memory::LayerMemory& bytes) {
  nlohmann::json j{{"layer_id", layer.id},
                   {"kind", arch::layer_kind_name(layer.kind)},
                   {"full_kv_bytes", bytes.bytes}};
  if (layer.attention) {
    j["num_heads"] = layer.attention->num_heads;
    j["num_kv_heads"] = layer.attention->num_kv_heads;
    j["head_dim"] = layer.attention->head_dim;
    j["window"] = layer.attention->sliding_window > 0
                      ? nlohmann::json(layer.attention->sliding_window)
                      : nlohmann::json("full");
  }
  nlohmann::json states = nlohmann::json::array();
  for (const auto& s : layer.states) {
    states.push_back({{"name", s.name}, {"shape", s.shape}, {"dtype", dtype_name(s.dtype)}});
  }
  if (!states.empty()) j["states"] = states;
  return j;
}

std::string layer_line(const arch::LayerSpec& layer, const memory::LayerMemory& bytes) {
  std::string what;
  if (layer.attention) {
    what = fmt::format("heads {:>3} kv {:>2} dim {:>3} window {:>6}", layer.attention->num_heads,
                       layer.attention->num_kv_heads, layer.attention->head_dim,
                       layer.attention->sliding_window > 0
                           ? std::to_string(layer.attention->sliding_window)
                           : "full");
  }
  for (const auto& s : layer.states)
    what += fmt::format("{}{} [{}] {}", what.empty() ? "" : "  ", s.name, fmt::join(s.shape, "x"),
                        dtype_name(s.dtype));
  return fmt::format("  {:>4}  {:<18} {:<48} {:>12}", layer.id, arch::layer_kind_name(layer.kind),
                     what, format_bytes(bytes.bytes));
}

void run_inspect(const InspectArgs& args) {
  apply_logging(args.flags);
  const auto dir = io::resolve_model_dir(args.model);
  const auto spec = arch::load_model_spec(dir);
  const auto checkpoint = io::Checkpoint::open(dir, /*allow_missing_weights=*/true);
  memory::MemoryOptions o;
  o.context = parse_token_count(args.context, "--context");
  o.batch = args.batch;
  o.block_size = args.block_size;
  o.kv_dtype = args.kv_dtype.empty() ? spec.dtype : parse_dtype(args.kv_dtype, "--kv-dtype");
  memory::validate_options(o);
  const auto estimate = memory::estimate(spec, memory::full_kv_windows(spec), o);
  const bool forward =
      arch::ArchitectureRegistry::instance().get(spec.model_type, dir.string()).create_model !=
      nullptr;
  const std::optional<int64_t> weights =
      checkpoint->has_weights() ? std::optional(checkpoint->weight_bytes()) : std::nullopt;
  if (args.flags.json) {
    // Assigned, not a conditional expression: GCC 12 warns (falsely) that the optional's value
    // may be read uninitialised when the json is moved out of one.
    nlohmann::json weights_bytes(nullptr);
    if (weights) weights_bytes = *weights;
    nlohmann::json layers = nlohmann::json::array();
    for (const auto& layer : spec.layers)
      layers.push_back(layer_json(layer, estimate.layers[static_cast<size_t>(layer.id)]));
    std::cout << nlohmann::json{{"model", dir.string()},
                                {"model_type", spec.model_type},
                                {"forward", forward},
                                {"hidden_size", spec.hidden_size},
                                {"vocab_size", spec.vocab_size},
                                {"dtype", dtype_name(spec.dtype)},
                                {"context", o.context},
                                {"batch", o.batch},
                                {"block_size", o.block_size},
                                {"kv_dtype", dtype_name(o.kv_dtype)},
                                {"global_layers", spec.global_layer_ids()},
                                {"weights_bytes", weights_bytes},
                                {"full_kv_total_bytes", estimate.total_bytes},
                                {"layers", layers}}
                     .dump(2)
              << "\n";
    return;
  }
  std::cout << fmt::format(
      "{}: {} ({}), {} layers, {} global, hidden {}, vocab {}, {}{}\n", dir.string(),
      spec.model_type, forward ? "forward + memory" : "memory only", spec.num_layers(),
      spec.global_layer_ids().size(), spec.hidden_size, spec.vocab_size, dtype_name(spec.dtype),
      weights ? fmt::format(", weights {}", format_bytes(*weights)) : ", no weights");
  for (const auto& layer : spec.layers)
    std::cout << layer_line(layer, estimate.layers[static_cast<size_t>(layer.id)]) << "\n";
  std::cout << fmt::format(
      "full-KV cache at context {} x batch {} ({} KV, block {}): {} ({} bytes)\n",
      format_tokens(o.context), o.batch, dtype_name(o.kv_dtype), o.block_size,
      format_bytes(estimate.total_bytes), estimate.total_bytes);
}

const RegisterCommand kRegister{
    "inspect", [](CLI::App& root) {
      static InspectArgs args;
      auto* cmd = root.add_subcommand(
          "inspect", "Layer kinds, heads, windows, states, weight bytes and full-KV cache bytes");
      cmd->add_option("--model", args.model,
                      "Model folder or cached HF repo id (config.json is enough)")
          ->required();
      cmd->add_option("--context", args.context, "Context for the full-KV figure (k = 1024)")
          ->capture_default_str();
      cmd->add_option("--batch", args.batch, "Sequences")->capture_default_str();
      cmd->add_option("--block-size", args.block_size, "Paged-cache block in tokens (1 = unpaged)")
          ->capture_default_str();
      cmd->add_option("--kv-dtype", args.kv_dtype, "KV dtype (default: the checkpoint's)");
      add_common_flags(cmd, args.flags, /*with_json=*/true);
      cmd->callback([] { run_inspect(args); });
    }};

}  // namespace
}  // namespace headwise::cli
