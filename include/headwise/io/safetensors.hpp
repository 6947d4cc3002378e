#pragma once
// Memory-mapped safetensors files. Opening maps the file and validates its header; no tensor
// data is read until a caller touches it, so a 27B checkpoint opens in milliseconds and
// costs host memory only for the pages a layer actually uses.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/core/dtype.hpp"

namespace headwise::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section (after the header)
  uint64_t end = 0;

  int64_t numel() const;
  int64_t nbytes() const { return static_cast<int64_t>(end - begin); }
};

// Parses and validates a header against the size of the data section that follows it:
// offsets inside the data, no overlaps, shape x element size == byte length. Pure (no I/O)
// so that it can be fuzzed. `label` names the file in error messages.
std::vector<TensorInfo> parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                                 std::string_view label);

class SafetensorsFile {
 public:
  static std::shared_ptr<const SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  std::string_view header_json() const { return header_; }
  // The tensor's bytes inside the mapping (valid while this file is alive).
  std::span<std::byte> bytes(const TensorInfo& info) const;
  int64_t tensor_bytes() const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  std::map<std::string, TensorInfo> tensors_;
  std::string header_;
  std::byte* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  uint64_t data_offset_ = 0;
};

// Writes tensors as a safetensors file (atomically). Used for `forward --output` and tests.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
};
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<TensorToWrite>& tensors);

}  // namespace headwise::io
