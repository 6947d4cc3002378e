#include <catch2/catch.hpp>

#include "headwise/core/error.hpp"
#include "headwise/core/units.hpp"

using namespace headwise;

TEST_CASE("token counts and byte sizes use powers of 1024", "[core]") {
  CHECK(parse_token_count("160k", "--context") == 163840);
  CHECK(parse_token_count("4096", "--context") == 4096);
  CHECK(parse_token_count("1M", "--context") == 1048576);
  CHECK(parse_byte_size("48g", "--budget") == int64_t{48} << 30);
  CHECK(parse_byte_size("48GiB", "--budget") == int64_t{48} << 30);
  CHECK(parse_byte_size("1.5g", "--budget") == int64_t{3} << 29);
  CHECK(parse_byte_size("512b", "--budget") == 512);
}

TEST_CASE("bad sizes name the flag", "[core]") {
  for (const char* bad : {"", "k", "-5", "0", "abc", "1.5", "4x", "1..2k"}) {
    try {
      parse_token_count(bad, "--context");
      FAIL("accepted '" << bad << "'");
    } catch (const InputError& e) {
      CHECK(std::string(e.what()).find("--context") != std::string::npos);
    }
  }
}
