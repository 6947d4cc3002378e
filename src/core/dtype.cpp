#include "headwise/core/dtype.hpp"

#include <array>
#include <utility>

#include "headwise/core/error.hpp"

namespace headwise {
namespace {

struct DTypeInfo {
  DType dtype;
  int64_t size;
  std::string_view name;
  std::string_view safetensors;
};

constexpr std::array<DTypeInfo, 12> kDTypes{{
    {DType::kFloat32, 4, "float32", "F32"},
    {DType::kBFloat16, 2, "bfloat16", "BF16"},
    {DType::kFloat16, 2, "float16", "F16"},
    {DType::kFloat8E4M3, 1, "float8_e4m3fn", "F8_E4M3"},
    {DType::kFloat8E5M2, 1, "float8_e5m2", "F8_E5M2"},
    {DType::kFloat64, 8, "float64", "F64"},
    {DType::kInt64, 8, "int64", "I64"},
    {DType::kInt32, 4, "int32", "I32"},
    {DType::kInt16, 2, "int16", "I16"},
    {DType::kInt8, 1, "int8", "I8"},
    {DType::kUInt8, 1, "uint8", "U8"},
    {DType::kBool, 1, "bool", "BOOL"},
}};

const DTypeInfo& info(DType dtype) {
  for (const auto& entry : kDTypes) {
    if (entry.dtype == dtype) return entry;
  }
  HEADWISE_CHECK(false, "unknown dtype {}", static_cast<int>(dtype));
}

}  // namespace

int64_t element_size(DType dtype) {
  return info(dtype).size;
}

std::string_view dtype_name(DType dtype) {
  return info(dtype).name;
}

DType parse_dtype(std::string_view text, std::string_view what) {
  std::string_view s = text;
  if (s.starts_with("torch.")) s.remove_prefix(6);
  static constexpr std::array<std::pair<std::string_view, DType>, 9> kAliases{{
      {"fp32", DType::kFloat32},
      {"float", DType::kFloat32},
      {"bf16", DType::kBFloat16},
      {"fp16", DType::kFloat16},
      {"half", DType::kFloat16},
      {"fp8", DType::kFloat8E4M3},
      {"fp8_e4m3", DType::kFloat8E4M3},
      {"float8_e4m3", DType::kFloat8E4M3},
      {"fp8_e5m2", DType::kFloat8E5M2},
  }};
  for (const auto& entry : kDTypes) {
    if (entry.name == s) return entry.dtype;
  }
  for (const auto& [alias, dtype] : kAliases) {
    if (alias == s) return dtype;
  }
  throw_input_error("{}: unknown dtype '{}' (use float32, bfloat16, float16 or fp8)", what, text);
}

DType parse_safetensors_dtype(std::string_view text, std::string_view what) {
  for (const auto& entry : kDTypes) {
    if (entry.safetensors == text) return entry.dtype;
  }
  throw_input_error("{}: unsupported safetensors dtype '{}'", what, text);
}

}  // namespace headwise
