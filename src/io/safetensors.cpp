#include "headwise/io/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"

namespace headwise::io {
namespace {

// Real headers are a few MB at most; anything larger is a corrupt length field.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

int64_t checked_numel(const std::vector<int64_t>& shape, std::string_view label,
                      std::string_view name) {
  int64_t numel = 1;
  for (int64_t dim : shape) {
    if (dim < 0) throw_input_error("{}: tensor '{}' has a negative dimension", label, name);
    if (dim != 0 && numel > std::numeric_limits<int64_t>::max() / dim) {
      throw_input_error("{}: tensor '{}' shape overflows", label, name);
    }
    numel *= dim;
  }
  return numel;
}

TensorInfo parse_entry(const std::string& name, const nlohmann::json& entry, uint64_t data_size,
                       std::string_view label) {
  if (!entry.is_object()) throw_input_error("{}: header entry '{}' is not an object", label, name);
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) throw_input_error("{}: tensor '{}' lacks '{}'", label, name, key);
  }
  const auto& dtype = entry["dtype"];
  const auto& shape = entry["shape"];
  const auto& offsets = entry["data_offsets"];
  if (!dtype.is_string()) throw_input_error("{}: tensor '{}': dtype is not a string", label, name);
  if (!shape.is_array()) throw_input_error("{}: tensor '{}': shape is not a list", label, name);
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    throw_input_error("{}: tensor '{}': data_offsets must be two non-negative integers", label,
                      name);
  }
  TensorInfo info;
  info.name = name;
  info.dtype = parse_safetensors_dtype(dtype.get<std::string>(),
                                       fmt::format("{}: tensor '{}'", label, name));
  for (const auto& dim : shape) {
    if (!dim.is_number_unsigned())
      throw_input_error("{}: tensor '{}': shape entries must be non-negative integers", label,
                        name);
    const uint64_t value = dim.get<uint64_t>();
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw_input_error("{}: tensor '{}': dimension too large", label, name);
    }
    info.shape.push_back(static_cast<int64_t>(value));
  }
  info.begin = offsets[0].get<uint64_t>();
  info.end = offsets[1].get<uint64_t>();
  if (info.begin > info.end || info.end > data_size) {
    throw_input_error(
        "{}: tensor '{}': data_offsets [{}, {}] outside the data section of {} bytes "
        "(truncated file?)",
        label, name, info.begin, info.end, data_size);
  }
  const int64_t numel = checked_numel(info.shape, label, name);
  const int64_t size = element_size(info.dtype);
  if (numel > std::numeric_limits<int64_t>::max() / size ||
      static_cast<uint64_t>(numel * size) != info.end - info.begin) {
    throw_input_error("{}: tensor '{}': shape needs {} bytes but data_offsets give {}", label, name,
                      numel * size, info.end - info.begin);
  }
  return info;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorInfo> parse_safetensors_header(std::string_view header_json, uint64_t data_size,
                                                 std::string_view label) {
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_json);
  } catch (const nlohmann::json::exception&) {
    // Not only parse_error: a number too large for a double (1e999) is out_of_range (found by
    // fuzz_safetensors_header).
    throw_input_error("{}: safetensors header is not valid JSON (corrupt file?)", label);
  }
  if (!header.is_object()) throw_input_error("{}: safetensors header is not a JSON object", label);
  std::vector<TensorInfo> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    tensors.push_back(parse_entry(name, entry, data_size, label));
  }
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      throw_input_error("{}: tensors '{}' and '{}' overlap", label, by_offset[i - 1]->name,
                        by_offset[i]->name);
    }
  }
  return tensors;
}

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::filesystem::path& path) {
  const std::string label = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_input_error("{}: cannot open: {}", label, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw_input_error("{}: not a regular file", label);
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    throw_input_error("{}: {} bytes is too short for a safetensors file (truncated?)", label,
                      file_size);
  }
  // Read-only: a write into a mapped weight would live in a private copy-on-write page, and the
  // layer streaming's MADV_DONTNEED would later drop it and silently bring back the file's bytes
  // (a result that depends on timing). Every weight is copied before use (DecoderModel::weight),
  // so nothing writes; PROT_READ turns a future mistake into a fault instead of a wrong answer.
  void* mapping = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED) throw_input_error("{}: mmap failed: {}", label, std::strerror(errno));

  std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = static_cast<std::byte*>(mapping);
  file->mapping_size_ = file_size;
  uint64_t header_size = 0;
  std::memcpy(&header_size, file->mapping_, 8);  // little-endian u64, as on every host we build for
  if (header_size > kMaxHeaderBytes || header_size > file_size - 8) {
    throw_input_error(
        "{}: header length {} does not fit a {}-byte file (truncated or not safetensors)", label,
        header_size, file_size);
  }
  file->header_.assign(reinterpret_cast<const char*>(file->mapping_ + 8), header_size);
  file->data_offset_ = 8 + header_size;
  for (auto& info :
       parse_safetensors_header(file->header_, file_size - file->data_offset_, label)) {
    std::string name = info.name;
    file->tensors_.emplace(std::move(name), std::move(info));
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

std::span<std::byte> SafetensorsFile::bytes(const TensorInfo& info) const {
  return {mapping_ + data_offset_ + info.begin, static_cast<size_t>(info.end - info.begin)};
}

int64_t SafetensorsFile::tensor_bytes() const {
  int64_t total = 0;
  for (const auto& [name, info] : tensors_) total += info.nbytes();
  return total;
}

void write_safetensors(const std::filesystem::path& path,
                       const std::vector<TensorToWrite>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    static const std::map<DType, std::string> kNames{
        {DType::kFloat32, "F32"}, {DType::kBFloat16, "BF16"}, {DType::kFloat16, "F16"},
        {DType::kInt64, "I64"},   {DType::kInt32, "I32"},     {DType::kUInt8, "U8"}};
    const auto it = kNames.find(t.dtype);
    HEADWISE_CHECK(it != kNames.end(), "write_safetensors: dtype {} not supported",
                   dtype_name(t.dtype));
    header[t.name] = {{"dtype", it->second},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string header_text = header.dump();
  while ((header_text.size() + 8) % 8 != 0) header_text.push_back(' ');
  std::string contents;
  contents.reserve(8 + header_text.size() + offset);
  const uint64_t header_size = header_text.size();
  contents.append(reinterpret_cast<const char*>(&header_size), 8);
  contents.append(header_text);
  for (const auto& t : tensors)
    contents.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
  write_file_atomically(path, contents);
}

}  // namespace headwise::io
