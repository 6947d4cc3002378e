#include "headwise/io/checkpoint.hpp"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"

namespace headwise::io {
namespace fs = std::filesystem;

namespace {

fs::path hf_hub_dir() {
  if (const char* hub = std::getenv("HF_HUB_CACHE"); hub && *hub) return hub;
  if (const char* home = std::getenv("HF_HOME"); home && *home) return fs::path(home) / "hub";
  const char* user_home = std::getenv("HOME");
  return fs::path(user_home ? user_home : "/root") / ".cache" / "huggingface" / "hub";
}

fs::path cached_snapshot(const fs::path& repo_dir) {
  const fs::path snapshots = repo_dir / "snapshots";
  std::error_code ec;
  if (fs::exists(repo_dir / "refs" / "main", ec)) {
    std::string ref = read_text_file(repo_dir / "refs" / "main");
    while (!ref.empty() && std::isspace(static_cast<unsigned char>(ref.back()))) ref.pop_back();
    if (fs::is_directory(snapshots / ref, ec)) return snapshots / ref;
  }
  std::vector<fs::path> candidates;
  if (fs::is_directory(snapshots, ec)) {
    for (const auto& entry : fs::directory_iterator(snapshots)) {
      if (entry.is_directory()) candidates.push_back(entry.path());
    }
  }
  if (candidates.size() == 1) return candidates.front();
  return {};
}

std::vector<fs::path> shard_paths(const fs::path& dir) {
  const fs::path index_path = dir / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    const auto index = read_json_file(index_path);
    if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw_input_error("{}: missing 'weight_map' object", index_path.string());
    }
    std::set<std::string> shards;
    for (const auto& [name, shard] : index["weight_map"].items()) {
      if (!shard.is_string())
        throw_input_error("{}: weight_map['{}'] is not a file name", index_path.string(), name);
      const std::string file = shard.get<std::string>();
      if (file.find('/') != std::string::npos || file.find("..") != std::string::npos) {
        throw_input_error("{}: weight_map['{}'] = '{}' points outside the model folder",
                          index_path.string(), name, file);
      }
      shards.insert(file);
    }
    std::vector<fs::path> paths;
    for (const auto& s : shards) {
      if (!fs::exists(dir / s, ec))
        throw_input_error("{}: shard '{}' named by the index is missing", dir.string(), s);
      paths.push_back(dir / s);
    }
    return paths;
  }
  if (fs::exists(dir / "model.safetensors", ec)) return {dir / "model.safetensors"};
  std::vector<fs::path> paths;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".safetensors") paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace

fs::path resolve_model_dir(std::string_view model_arg) {
  if (model_arg.empty()) throw_field_error("model", ": empty path");
  std::error_code ec;
  const fs::path as_path(model_arg);
  if (fs::is_directory(as_path, ec)) return as_path;
  if (fs::exists(as_path, ec))
    throw_field_error("model", " {}: expected a model folder, got a file", model_arg);
  const auto slash = model_arg.find('/');
  if (slash != std::string_view::npos && slash > 0 &&
      model_arg.find('/', slash + 1) == std::string_view::npos && !model_arg.starts_with(".")) {
    const std::string repo =
        fmt::format("models--{}--{}", model_arg.substr(0, slash), model_arg.substr(slash + 1));
    const fs::path repo_dir = hf_hub_dir() / repo;
    const fs::path snapshot = cached_snapshot(repo_dir);
    if (!snapshot.empty()) return snapshot;
    throw_field_error("model",
                      " {}: no such folder, and no snapshot in the local Hugging Face cache at {} "
                      "(headwise never downloads; fetch the model first)",
                      model_arg, repo_dir.string());
  }
  throw_field_error("model", " {}: no such folder", model_arg);
}

std::shared_ptr<const Checkpoint> Checkpoint::open(const fs::path& model_dir,
                                                   bool allow_missing_weights) {
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec))
    throw_input_error("{}: not a model folder", model_dir.string());
  auto checkpoint = std::shared_ptr<Checkpoint>(new Checkpoint());
  checkpoint->dir_ = model_dir;
  const auto paths = shard_paths(model_dir);
  if (paths.empty() && !allow_missing_weights) {
    throw_input_error(
        "{}: no safetensors weights (model.safetensors or model.safetensors.index.json)",
        model_dir.string());
  }
  for (const auto& path : paths) {
    checkpoint->files_.push_back(SafetensorsFile::open(path));
    const SafetensorsFile* file = checkpoint->files_.back().get();
    for (const auto& [name, info] : file->tensors()) {
      auto [it, inserted] = checkpoint->index_.emplace(name, Entry{file, &info});
      if (!inserted) {
        throw_input_error("{}: tensor '{}' appears in both {} and {}", model_dir.string(), name,
                          it->second.file->path().filename().string(), path.filename().string());
      }
    }
  }
  return checkpoint;
}

bool Checkpoint::contains(std::string_view name) const {
  return index_.find(name) != index_.end();
}

const Checkpoint::Entry& Checkpoint::find(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end())
    throw_input_error("{}: tensor '{}' not found in the checkpoint", dir_.string(), name);
  return it->second;
}

const TensorInfo& Checkpoint::info(std::string_view name) const {
  return *find(name).info;
}
const SafetensorsFile& Checkpoint::file_of(std::string_view name) const {
  return *find(name).file;
}
std::span<std::byte> Checkpoint::bytes(std::string_view name) const {
  const auto& entry = find(name);
  return entry.file->bytes(*entry.info);
}

std::vector<std::string> Checkpoint::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(index_.size());
  for (const auto& [name, entry] : index_) names.push_back(name);
  return names;
}

int64_t Checkpoint::weight_bytes() const {
  int64_t total = 0;
  for (const auto& file : files_) total += file->tensor_bytes();
  return total;
}

std::string Checkpoint::headers_sha256() const {
  std::vector<const SafetensorsFile*> sorted;
  for (const auto& f : files_) sorted.push_back(f.get());
  std::sort(sorted.begin(), sorted.end(), [](const auto* a, const auto* b) {
    return a->path().filename() < b->path().filename();
  });
  std::string all;
  for (const auto* f : sorted) {
    all += f->path().filename().string();
    all.push_back('\0');
    all += f->header_json();
    all.push_back('\0');
  }
  return sha256_hex(all);
}

}  // namespace headwise::io
