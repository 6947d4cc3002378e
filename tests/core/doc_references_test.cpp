// Every `docs/<name>.md` (or .svg) the repository mentions exists: code comments and pages must
// not send a reader to a page that is not there.
#include <catch2/catch.hpp>
#include "../support/test_paths.hpp"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

const fs::path kRoot = fs::weakly_canonical(fs::path(HEADWISE_FIXTURES_DIR) / ".." / "..");

bool is_text_source(const fs::path& p) {
  static const std::set<std::string> kinds{".md", ".cpp", ".hpp", ".c",    ".cu",   ".cuh",
                                           ".py", ".sh",  ".txt", ".yaml", ".cmake"};
  return kinds.contains(p.extension().string()) || p.filename() == "CMakeLists.txt";
}

bool continues_path(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
         c == '/';
}

// The `docs/...` paths in `text` that start a path (not `shared/docs/...`, which is outside the
// repository) and name a page or picture.
std::vector<std::string> doc_references(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = text.find("docs/"); at != std::string::npos; at = text.find("docs/", at + 1)) {
    if (at > 0 && continues_path(text[at - 1])) continue;
    size_t end = at + 5;
    while (end < text.size() && continues_path(text[end])) ++end;
    std::string ref = text.substr(at, end - at);
    while (!ref.empty() && ref.back() == '.') ref.pop_back();  // a sentence's full stop
    if (ref.ends_with(".md") || ref.ends_with(".svg")) out.push_back(ref);
  }
  return out;
}

}  // namespace

TEST_CASE("every docs/ page the repository mentions exists", "[core]") {
  std::vector<fs::path> files{kRoot / "README.md"};
  for (const char* dir : {"docs", "src", "include", "tests", "tools", "policies"}) {
    for (const auto& entry : fs::recursive_directory_iterator(kRoot / dir)) {
      const std::string path = entry.path().string();
      if (entry.is_regular_file() && is_text_source(entry.path()) &&
          path.find("/fixtures/") == std::string::npos) {
        files.push_back(entry.path());
      }
    }
  }
  std::vector<std::string> missing;
  size_t checked = 0;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const auto& ref : doc_references(text)) {
      ++checked;
      if (!fs::exists(kRoot / ref))
        missing.push_back(fs::relative(file, kRoot).string() + " → " + ref);
    }
  }
  CHECK(checked > 3);  // the scan finds the references there are (README, docs pages)
  for (const auto& m : missing) UNSCOPED_INFO(m);
  CHECK(missing.empty());
}
