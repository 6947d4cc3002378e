// `headwise-calc forward`: logits of a token list, for checking a converted checkpoint
// against another implementation. With --policy, the logits under that policy from the runtime
// decoder (each global KV head keeps only its window's slots; chunked prefill as in eval), for
// checking another implementation of the policy (python/headwise_hf) against this one.
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include <optional>

#include "headwise/arch/model.hpp"
#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/io/checkpoint.hpp"
#include "headwise/io/safetensors.hpp"
#include "headwise/policy/policy.hpp"
#include "headwise/runtime/decoder.hpp"
#include "policy_check.hpp"

namespace headwise::cli {
namespace {

struct ForwardArgs {
  std::string model;
  std::string tokens;
  std::string output;
  std::string device = "cpu";
  std::string dtype;
  int64_t attention_chunk = 512;
  std::string policy;           // policy.yaml: logits under it from the runtime decoder
  int64_t prefill_chunk = 256;  // with --policy: tokens per prefill chunk (eval's default)
  std::string prefill_schedule = "whole";  // with --policy: whole or layer (runtime/decoder.hpp)
  bool prefill_schedule_given = false;
  bool prefill_chunk_given = false;
  std::string runtime_attention = "fused";
  bool runtime_attention_given = false;
  CommonFlags flags;
};

std::vector<int64_t> read_token_list(const std::string& path, int64_t vocab_size) {
  const auto json = read_json_file(path);
  if (!json.is_array() || json.empty())
    throw_input_error("{}: expected a non-empty JSON list of token ids", path);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < json.size(); ++i) {
    if (!json[i].is_number_integer())
      throw_input_error("{}: entry {} is not an integer token id", path, i);
    const auto id = json[i].get<int64_t>();
    if (id < 0 || id >= vocab_size)
      throw_input_error("{}: token id {} at entry {} is outside the vocabulary [0, {})", path, id,
                        i, vocab_size);
    ids.push_back(id);
  }
  return ids;
}

void run_forward(const ForwardArgs& args) {
  apply_logging(args.flags);
  if (args.policy.empty() && args.prefill_chunk_given)
    throw_input_error("--prefill-chunk: only with --policy");
  if (args.policy.empty() && args.prefill_schedule_given)
    throw_input_error("--prefill-schedule: only with --policy");
  const runtime::PrefillSchedule schedule =
      runtime::prefill_schedule_from_name(args.prefill_schedule, "--prefill-schedule");
  if (args.policy.empty() && args.runtime_attention_given)
    throw_input_error("--runtime-attention: only with --policy");
  (void)runtime_attention_kernel(
      args.runtime_attention);  // a bad name fails before the weights load
  if (args.prefill_chunk <= 0)
    throw_input_error("--prefill-chunk must be positive, got {}", args.prefill_chunk);
  c10::InferenceMode inference;
  arch::ModelOptions options;
  options.device = args.device;
  options.attention_chunk = args.attention_chunk;
  if (!args.dtype.empty()) options.compute_dtype = parse_dtype(args.dtype, "--dtype");
  const auto dir = io::resolve_model_dir(args.model);
  std::optional<policy::Policy> pol;
  if (!args.policy.empty()) {
    // Checked before the weights load: a wrong policy fails fast.
    pol = policy::read_policy(args.policy);
    check_policy_matches(*pol, dir, arch::load_model_spec(dir), args.policy);
  }
  auto model = arch::load_model(dir, options);
  const auto ids = read_token_list(args.tokens, model->spec().vocab_size);
  const at::Tensor input = at::tensor(ids, at::kLong).view({1, -1}).to(model->device());
  at::Tensor logits;
  if (pol) {
    memory::MemoryOptions o = pol->memory_options();
    o.batch = 1;
    if (static_cast<int64_t>(ids.size()) > o.context) {
      throw_input_error("--tokens {}: {} tokens exceed the context of {} tokens of --policy {}",
                        args.tokens, ids.size(), o.context, args.policy);
    }
    const auto selection = runtime::policy_selection(*pol);
    runtime::Decoder decoder = selection
                                   ? runtime::Decoder(*model, pol->head_windows(), o, *selection)
                                   : runtime::Decoder(*model, pol->head_windows(), o);
    decoder.set_attention_kernel(runtime_attention_kernel(args.runtime_attention));
    decoder.set_prefill_schedule(schedule);
    logits = decoder.prefill(input, args.prefill_chunk)[0].to(at::kCPU, at::kFloat).contiguous();
    spdlog::info(
        "{}: {} tokens under {} (prefill chunks of {}, {} schedule, cache {} bytes, peak KV {} "
        "bytes) → logits [{}, {}]",
        dir.string(), ids.size(), args.policy, args.prefill_chunk, args.prefill_schedule,
        decoder.cache_bytes() + decoder.bookkeeping_bytes(), decoder.peak_kv_bytes(),
        logits.size(0), logits.size(1));
  } else {
    logits = model->forward(input)[0].to(at::kCPU, at::kFloat).contiguous();
    spdlog::info("{}: {} tokens → logits [{}, {}]", dir.string(), ids.size(), logits.size(0),
                 logits.size(1));
  }
  const auto* data = static_cast<const std::byte*>(logits.data_ptr());
  io::write_safetensors(args.output, {{"logits",
                                       DType::kFloat32,
                                       {logits.size(0), logits.size(1)},
                                       {data, static_cast<size_t>(logits.nbytes())}}});
}

const RegisterCommand kRegister{
    "forward", [](CLI::App& root) {
      static ForwardArgs args;
      auto* cmd = root.add_subcommand(
          "forward", "Run the model on a token list and write float32 logits [T, vocab]");
      cmd->add_option("--model", args.model,
                      "Model folder (config.json + safetensors) or cached HF repo id")
          ->required();
      cmd->add_option("--tokens", args.tokens, "JSON file with a list of token ids")->required();
      cmd->add_option("-o,--output", args.output, "Output .safetensors file (tensor 'logits')")
          ->required();
      cmd->add_option("--device", args.device, "cpu, cuda or cuda:N")->capture_default_str();
      cmd->add_option("--dtype", args.dtype,
                      "Compute dtype (default: float32 on CPU, the checkpoint's on CUDA)");
      cmd->add_option("--attention-chunk", args.attention_chunk, "Queries per attention chunk")
          ->capture_default_str();
      cmd->add_option("--policy", args.policy,
                      "policy.yaml made for this model: logits under it from the runtime decoder "
                      "(windows applied "
                      "physically, batch 1, at most the policy's context)");
      auto* prefill = cmd->add_option("--prefill-chunk", args.prefill_chunk,
                                      "With --policy: tokens per prefill chunk")
                          ->capture_default_str();
      auto* schedule = cmd->add_option("--prefill-schedule", args.prefill_schedule,
                                       "With --policy: whole (chunk by chunk through every layer) "
                                       "or layer (every chunk through a layer before the next; "
                                       "snap heads choose layer by layer)")
                           ->capture_default_str();
      auto* runtime_attention = add_runtime_attention_option(cmd, args.runtime_attention);
      add_common_flags(cmd, args.flags, /*with_json=*/false);
      cmd->callback([prefill, schedule, runtime_attention] {
        args.prefill_chunk_given = prefill->count() > 0;
        args.prefill_schedule_given = schedule->count() > 0;
        args.runtime_attention_given = runtime_attention->count() > 0;
        run_forward(args);
      });
    }};

}  // namespace
}  // namespace headwise::cli
