#pragma once
// Element types as headwise names them in files and flags ("bfloat16", "float32", ...).
#include <cstdint>
#include <string>
#include <string_view>

namespace headwise {

enum class DType {
  kFloat32,
  kBFloat16,
  kFloat16,
  kFloat8E4M3,
  kFloat8E5M2,
  kFloat64,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool,
};

int64_t element_size(DType dtype);
// Canonical name: "float32", "bfloat16", "float16", "float8_e4m3fn", ...
std::string_view dtype_name(DType dtype);
// Accepts canonical names plus common spellings ("bf16", "fp16", "fp32", "fp8", "torch.bfloat16").
// `what` names the flag or field for the error message.
DType parse_dtype(std::string_view text, std::string_view what);
// Safetensors header spellings: "F32", "BF16", "F16", "F8_E4M3", "I64", "U8", "BOOL", ...
DType parse_safetensors_dtype(std::string_view text, std::string_view what);

}  // namespace headwise
