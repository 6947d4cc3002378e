#pragma once
// A Hugging Face model directory: config.json plus one or more safetensors shards
// (model.safetensors, or model.safetensors.index.json naming the shards). Every shard is
// memory-mapped; tensors are looked up by name and read on demand, one layer at a time.
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/io/safetensors.hpp"

namespace headwise::io {

// `--model` accepts a directory or a Hugging Face repo id ("ORG/NAME") already in the local
// cache ($HF_HOME/hub, default ~/.cache/huggingface/hub). Never downloads.
std::filesystem::path resolve_model_dir(std::string_view model_arg);

class Checkpoint {
 public:
  // Opens every shard of the directory. A directory without safetensors is an error unless
  // `allow_missing_weights` (mem-estimate works from config.json alone).
  static std::shared_ptr<const Checkpoint> open(const std::filesystem::path& model_dir,
                                                bool allow_missing_weights = false);

  const std::filesystem::path& dir() const { return dir_; }
  bool has_weights() const { return !files_.empty(); }
  bool contains(std::string_view name) const;
  // Throws InputError naming the tensor and the directory when absent.
  const TensorInfo& info(std::string_view name) const;
  const SafetensorsFile& file_of(std::string_view name) const;
  std::span<std::byte> bytes(std::string_view name) const;
  std::vector<std::string> tensor_names() const;  // sorted
  // Exact bytes of all tensors, from the headers.
  int64_t weight_bytes() const;
  // sha256 over the shard headers in shard-name order (identifies the weights' layout).
  std::string headers_sha256() const;

 private:
  struct Entry {
    const SafetensorsFile* file;
    const TensorInfo* info;
  };
  const Entry& find(std::string_view name) const;

  std::filesystem::path dir_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, Entry, std::less<>> index_;
};

}  // namespace headwise::io
