#include "headwise/core/files.hpp"
#include "headwise/core/json.hpp"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "headwise/core/error.hpp"

namespace headwise {
namespace fs = std::filesystem;

std::string read_text_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw_input_error("{}: no such file", path.string());
  if (fs::is_directory(path, ec))
    throw_input_error("{}: is a directory, expected a file", path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_input_error("{}: cannot open for reading", path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw_input_error("{}: read failed", path.string());
  return buffer.str();
}

nlohmann::json parse_json(std::string_view text, std::string_view where) {
  const auto limit_depth = [where](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth)
      throw_input_error("{}: JSON nested deeper than {} levels", where, kMaxJsonDepth);
    return true;
  };
  try {
    return nlohmann::json::parse(text, limit_depth);
  } catch (const nlohmann::json::parse_error& e) {
    // nlohmann reports a byte offset; turn it into line:column for people.
    size_t line = 1, column = 1;
    for (size_t i = 0; i < std::min(e.byte, text.size()); ++i) {
      if (text[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    throw_input_error("{}:{}:{}: malformed JSON", where, line, column);
  } catch (const nlohmann::json::exception& e) {
    // A number out of double range (1e999) is out_of_range, not parse_error (fuzzing finding).
    throw_input_error("{}: malformed JSON: {}", where, e.what());
  }
}

nlohmann::json read_json_file(const fs::path& path) {
  return parse_json(read_text_file(path), path.string());
}

void write_file_atomically(const fs::path& path, std::string_view contents) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw_input_error("{}: output folder does not exist", dir.string());
  std::random_device rd;
  const fs::path tmp =
      dir / fmt::format(".{}.tmp-{}-{:x}", path.filename().string(), ::getpid(), rd());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw_input_error("{}: cannot write", path.string());
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.flush();
    if (!out) {
      out.close();
      fs::remove(tmp, ec);
      throw_input_error("{}: write failed (disk full?)", path.string());
    }
  }
  // Flushed to the kernel is not on disk: without fsync a power loss right after the rename
  // can leave an empty file under the final name.
  if (const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw_input_error("{}: cannot replace file: {}", path.string(), ec.message());
  }
}

namespace {

std::string to_hex(const unsigned char* digest, unsigned int size) {
  std::string hex;
  hex.reserve(size * 2);
  for (unsigned int i = 0; i < size; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

struct DigestDeleter {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int size = 0;
  HEADWISE_CHECK(
      EVP_Digest(bytes.data(), bytes.size(), digest.data(), &size, EVP_sha256(), nullptr) == 1,
      "EVP_Digest failed");
  return to_hex(digest.data(), size);
}

std::string sha256_file_hex(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_input_error("{}: cannot open for reading", path.string());
  std::unique_ptr<EVP_MD_CTX, DigestDeleter> ctx(EVP_MD_CTX_new());
  HEADWISE_CHECK(ctx && EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, "sha256 init");
  std::array<char, 1 << 16> buffer{};
  while (in) {
    in.read(buffer.data(), buffer.size());
    if (in.gcount() > 0)
      EVP_DigestUpdate(ctx.get(), buffer.data(), static_cast<size_t>(in.gcount()));
  }
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int size = 0;
  EVP_DigestFinal_ex(ctx.get(), digest.data(), &size);
  return to_hex(digest.data(), size);
}

}  // namespace headwise
