#include "headwise/arch/model.hpp"

#include <c10/core/InferenceMode.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "headwise/arch/layer_prefetch.hpp"
#include "headwise/arch/ops.hpp"
#include "headwise/core/error.hpp"
#include "headwise/io/checkpoint.hpp"

namespace headwise::arch {
namespace {

// Large host weights live in their own anonymous mappings, so releasing a streamed layer gives its
// memory back to the system at once. From the C++ heap they did not always go back: glibc keeps
// freed blocks in its heap once its dynamic mmap threshold has risen past their size (it does
// after the first large free), and the next layer's tensors do not fit the holes exactly. At
// Qwen3-Next-80B's layer dimensions the answer-span calibration, which loads and releases layers
// many times, peaked at 1.09x its one-layer plan that way (tools/scale-proof.sh; 0.93x with glibc's
// threshold fixed at 128 KiB for the whole process, which would also map every large activation).
at::Tensor mapped_host_copy(const std::string& name, const at::Tensor& source, at::ScalarType dtype,
                            int64_t bytes) {
  void* data = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (data == MAP_FAILED) {
    throw Error(
        fmt::format("cannot map {} bytes for weight {}: {}", bytes, name, std::strerror(errno)));
  }
  at::Tensor copy = at::from_blob(
      data, source.sizes(), [bytes](void* p) { munmap(p, static_cast<size_t>(bytes)); },
      at::TensorOptions().dtype(dtype).device(at::kCPU));
  copy.copy_(source);
  return copy;
}

}  // namespace

std::string shape_string(at::IntArrayRef shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

at::ScalarType to_scalar_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return at::kFloat;
    case DType::kBFloat16:
      return at::kBFloat16;
    case DType::kFloat16:
      return at::kHalf;
    case DType::kFloat8E4M3:
      return at::kFloat8_e4m3fn;
    case DType::kFloat8E5M2:
      return at::kFloat8_e5m2;
    case DType::kFloat64:
      return at::kDouble;
    case DType::kInt64:
      return at::kLong;
    case DType::kInt32:
      return at::kInt;
    case DType::kInt16:
      return at::kShort;
    case DType::kInt8:
      return at::kChar;
    case DType::kUInt8:
      return at::kByte;
    case DType::kBool:
      return at::kBool;
  }
  HEADWISE_CHECK(false, "unmapped dtype");
}

DType from_scalar_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return DType::kFloat32;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kHalf:
      return DType::kFloat16;
    case at::kDouble:
      return DType::kFloat64;
    case at::kLong:
      return DType::kInt64;
    case at::kInt:
      return DType::kInt32;
    default:
      HEADWISE_CHECK(false, "unmapped scalar type {}", c10::toString(type));
  }
}

at::Tensor checkpoint_tensor(const std::shared_ptr<const io::Checkpoint>& checkpoint,
                             const std::string& name) {
  const auto& info = checkpoint->info(name);
  auto bytes = checkpoint->bytes(name);
  // The deleter holds the checkpoint, so the mapping outlives every view of it.
  auto keep_alive = checkpoint;
  return at::from_blob(
      bytes.data(), info.shape, [keep_alive](void*) {},
      at::TensorOptions().dtype(to_scalar_type(info.dtype)).device(at::kCPU));
}

namespace {

at::ScalarType compute_dtype_for(const ModelSpec& spec, const ModelOptions& options,
                                 const at::Device& device) {
  if (options.compute_dtype) return to_scalar_type(*options.compute_dtype);
  // fp32 on CPU: bf16 matmuls there are slow and the numerics of references are fp32.
  return device.is_cpu() ? at::kFloat : to_scalar_type(spec.dtype);
}

at::Device parse_device(const std::string& text) {
  try {
    at::Device device(text);
    if (device.is_cuda() && !at::hasCUDA())
      throw_field_error("device", " {}: no CUDA device available here", text);
    return device;
  } catch (const c10::Error&) {
    throw_field_error("device", ": cannot parse '{}' (use cpu, cuda or cuda:N)", text);
  }
}

}  // namespace

DecoderModel::DecoderModel(ModelSpec spec, std::shared_ptr<const io::Checkpoint> checkpoint,
                           const ModelOptions& options)
    : spec_(std::move(spec)),
      checkpoint_(std::move(checkpoint)),
      options_(options),
      device_(parse_device(options.device)),
      dtype_(compute_dtype_for(spec_, options, device_)) {
  if (options_.attention_chunk <= 0) throw_field_error("attention_chunk", " must be positive");
}

DecoderModel::~DecoderModel() = default;  // after LayerPrefetcher is complete: it waits for its job

at::Tensor DecoderModel::hidden_states(const at::Tensor& input_ids, AttentionCore& core) {
  at::Tensor hidden = embed(input_ids);
  LayerRun run;
  run.attention = &core;
  for (int64_t i = 0; i < spec_.num_layers(); ++i) {
    prefetch_layer(i + 1);
    hidden = run_layer(i, hidden, run);
  }
  return hidden;
}

at::Tensor DecoderModel::forward(const at::Tensor& input_ids) {
  c10::InferenceMode inference;
  ExactAttentionCore exact(options_.attention_chunk);
  return logits(hidden_states(input_ids, exact));
}

ConfigReader DecoderModel::text_config_reader() const {
  return ConfigReader(spec_.text_config, (checkpoint_->dir() / "config.json").string());
}

at::Tensor DecoderModel::attend_core(const AttentionInputs& inputs, const LayerRun& run) const {
  if (run.attention != nullptr) return run.attention->attend(inputs);
  ExactAttentionCore exact(options_.attention_chunk);
  return exact.attend(inputs);
}

void DecoderModel::validate_weights() const {
  for (const auto& req : required_weights()) {
    if (!checkpoint_->contains(req.name)) {
      if (req.optional) continue;
      throw_input_error("{}: tensor '{}' is missing (needed by {} layer {})",
                        checkpoint_->dir().string(), req.name, spec_.model_type, req.layer);
    }
    const auto& info = checkpoint_->info(req.name);
    if (info.shape != req.shape) {
      throw_input_error("{}: tensor '{}' has shape [{}], expected [{}]",
                        checkpoint_->file_of(req.name).path().string(), req.name,
                        fmt::join(info.shape, ", "), fmt::join(req.shape, ", "));
    }
    switch (info.dtype) {
      case DType::kFloat32:
      case DType::kBFloat16:
      case DType::kFloat16:
        break;
      default:
        throw_input_error(
            "{}: tensor '{}' has dtype {}; headwise reads float32, bfloat16 and float16 weights",
            checkpoint_->file_of(req.name).path().string(), req.name, dtype_name(info.dtype));
    }
  }
}

bool DecoderModel::has_weight(const std::string& name) const {
  return checkpoint_->contains(name);
}

const at::Tensor& DecoderModel::layer_tensor(int64_t layer, std::string_view name,
                                             std::string_view prefix, bool keep_fp32) {
  return weight(layer, fmt::format("{}layers.{}.{}", prefix, layer, name), keep_fp32);
}

at::Tensor DecoderModel::layer_linear(int64_t layer, std::string_view name, const at::Tensor& x,
                                      bool bias, std::string_view prefix) {
  const at::Tensor& weight_t = layer_tensor(layer, fmt::format("{}.weight", name), prefix);
  return bias ? arch::linear(x, weight_t, layer_tensor(layer, fmt::format("{}.bias", name), prefix))
              : arch::linear(x, weight_t);
}

at::Tensor DecoderModel::embed_tokens(const at::Tensor& input_ids, const std::string& name) {
  return at::embedding(weight(-1, name), input_ids.to(device(), at::kLong));
}

at::Tensor DecoderModel::norm_and_head(const at::Tensor& hidden, const std::string& norm,
                                       double eps, NormStyle style, bool tied,
                                       const std::string& embedding) {
  const int64_t top = spec().num_layers();
  const at::Tensor h = rms_norm(hidden, weight(top, norm), eps, style);
  return arch::linear(h, tied ? weight(-1, embedding) : weight(top, "lm_head.weight"))
      .to(at::kFloat);
}

at::Tensor DecoderModel::attend_and_project(AttentionInputs in, const LayerRun& run,
                                            std::string_view o_proj, bool o_bias,
                                            std::string_view prefix) {
  const int64_t batch = in.q.size(0), heads = in.q.size(1), steps = in.q.size(2),
                head_dim = in.q.size(3);
  in.q = in.q.contiguous();  // cores may view heads as KV groups
  in.k = in.k.contiguous();
  in.v = in.v.contiguous();
  in.position_offset = run.position_offset;
  in.o_proj_weight = layer_tensor(in.layer_id, fmt::format("{}.weight", o_proj), prefix);
  const at::Tensor out = attend_core(in, run).reshape({batch, steps, heads * head_dim});
  return layer_linear(in.layer_id, o_proj, out, o_bias, prefix);
}

const at::Tensor& DecoderModel::weight(int64_t layer, const std::string& name, bool keep_fp32) {
  auto& slot = resident_[layer];
  if (auto it = slot.find(name); it != slot.end()) {
    // A weight loaded under InferenceMode cannot be saved for backward; reload it once for a
    // differentiable run (the answer-grad measure) instead of failing inside autograd.
    if (!it->second.is_inference() || c10::InferenceMode::is_enabled()) return it->second;
    slot.erase(it);
  }
  if (prefetcher_ && prefetcher_->pending(layer)) {
    for (auto& [prefetched, tensor] : prefetcher_->take(layer))
      slot.try_emplace(prefetched, std::move(tensor));
    if (auto it = slot.find(name); it != slot.end()) {
      // Prefetched at the dtype required_weights() named; a caller asking otherwise still wins.
      const at::ScalarType wanted = keep_fp32 ? at::kFloat : dtype_;
      if (it->second.scalar_type() != wanted) it->second = it->second.to(wanted);
      return it->second;
    }
  }
  const at::ScalarType target = keep_fp32 ? at::kFloat : dtype_;
  at::Tensor view = checkpoint_tensor(checkpoint_, name);
  // Always copy: the mapping is shared and private COW pages would otherwise be dirtied by any
  // in-place op; device/dtype conversion copies anyway.
  const int64_t bytes = view.numel() * static_cast<int64_t>(c10::elementSize(target));
  at::Tensor loaded = device_.is_cpu() && bytes >= options_.own_mapping_min_bytes
                          ? mapped_host_copy(name, view, target, bytes)
                          : view.to(device_, target, /*non_blocking=*/false, /*copy=*/true);
  return slot.emplace(name, std::move(loaded)).first->second;
}

const std::vector<WeightRequirement>& DecoderModel::weights_of(int64_t layer) {
  if (layer_weights_.empty()) {
    for (auto& req : required_weights()) {
      if (checkpoint_->contains(req.name)) layer_weights_[req.layer].push_back(std::move(req));
    }
  }
  static const std::vector<WeightRequirement> none;
  const auto it = layer_weights_.find(layer);
  return it == layer_weights_.end() ? none : it->second;
}

void DecoderModel::prefetch_layer(int64_t layer) {
  if (layer < 0 || layer >= spec_.num_layers() || resident_.count(layer) != 0) return;
  if (!prefetcher_) prefetcher_ = std::make_unique<LayerPrefetcher>(checkpoint_, device_);
  std::vector<PrefetchTensor> tensors;
  for (const auto& req : weights_of(layer))
    tensors.push_back({req.name, req.keep_fp32 ? at::kFloat : dtype_});
  prefetcher_->start(layer, std::move(tensors));
}

void DecoderModel::release_layer(int64_t layer) {
  resident_.erase(layer);
  // A prefetch of this layer may still be reading its pages on another thread: let it finish
  // before the pages are dropped (and drop what it loaded).
  if (prefetcher_ && prefetcher_->pending(layer)) prefetcher_->take(layer);
  // Streamed layers [0, L) only: embeddings and the head are shared and read again at the end.
  if (layer < 0 || layer >= spec_.num_layers()) return;
  for (const auto& req : weights_of(layer)) drop_mapped_pages(checkpoint_->bytes(req.name));
}

void DecoderModel::release_all() {
  resident_.clear();
}

int64_t DecoderModel::resident_weight_bytes() const {
  int64_t total = 0;
  for (const auto& [layer, tensors] : resident_) {
    for (const auto& [name, t] : tensors) total += static_cast<int64_t>(t.nbytes());
  }
  return total;
}

}  // namespace headwise::arch
