// `headwise-calc forward`: logits of a token list, for checking a converted checkpoint
// against another implementation.
#include <c10/core/InferenceMode.h>
#include <spdlog/spdlog.h>

#include "headwise/arch/model.hpp"
#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/io/checkpoint.hpp"
#include "headwise/io/safetensors.hpp"

namespace headwise::cli {
namespace {

struct ForwardArgs {
  std::string model;
  std::string tokens;
  std::string output;
  std::string device = "cpu";
  std::string dtype;
  int64_t attention_chunk = 512;
  CommonFlags flags;
};

std::vector<int64_t> read_token_list(const std::string& path, int64_t vocab_size) {
  const auto json = read_json_file(path);
  if (!json.is_array() || json.empty()) throw_input_error("{}: expected a non-empty JSON list of token ids", path);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < json.size(); ++i) {
    if (!json[i].is_number_integer()) throw_input_error("{}: entry {} is not an integer token id", path, i);
    const auto id = json[i].get<int64_t>();
    if (id < 0 || id >= vocab_size) throw_input_error("{}: token id {} at entry {} is outside the vocabulary [0, {})", path, id, i, vocab_size);
    ids.push_back(id);
  }
  return ids;
}

void run_forward(const ForwardArgs& args) {
  apply_logging(args.flags);
  c10::InferenceMode inference;
  arch::ModelOptions options;
  options.device = args.device;
  options.attention_chunk = args.attention_chunk;
  if (!args.dtype.empty()) options.compute_dtype = parse_dtype(args.dtype, "--dtype");
  const auto dir = io::resolve_model_dir(args.model);
  auto model = arch::load_model(dir, options);
  const auto ids = read_token_list(args.tokens, model->spec().vocab_size);
  const at::Tensor input = at::tensor(ids, at::kLong).view({1, -1}).to(model->device());
  const at::Tensor logits = model->forward(input)[0].to(at::kCPU, at::kFloat).contiguous();
  spdlog::info("{}: {} tokens → logits [{}, {}]", dir.string(), ids.size(), logits.size(0), logits.size(1));
  const auto* data = static_cast<const std::byte*>(logits.data_ptr());
  io::write_safetensors(args.output, {{"logits", DType::kFloat32, {logits.size(0), logits.size(1)},
                                       {data, static_cast<size_t>(logits.nbytes())}}});
}

const RegisterCommand kRegister{"forward", [](CLI::App& root) {
  static ForwardArgs args;
  auto* cmd = root.add_subcommand("forward", "Run the model on a token list and write float32 logits [T, vocab]");
  cmd->add_option("--model", args.model, "Model folder (config.json + safetensors) or cached HF repo id")->required();
  cmd->add_option("--tokens", args.tokens, "JSON file with a list of token ids")->required();
  cmd->add_option("-o,--output", args.output, "Output .safetensors file (tensor 'logits')")->required();
  cmd->add_option("--device", args.device, "cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--dtype", args.dtype, "Compute dtype (default: float32 on CPU, the checkpoint's on CUDA)");
  cmd->add_option("--attention-chunk", args.attention_chunk, "Queries per attention chunk")->capture_default_str();
  add_common_flags(cmd, args.flags, /*with_json=*/false);
  cmd->callback([] { run_forward(args); });
}};

}  // namespace
}  // namespace headwise::cli
