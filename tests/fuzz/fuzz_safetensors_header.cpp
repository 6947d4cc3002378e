// Fuzzes io::parse_safetensors_header: the first 8 input bytes give the size of the data
// section, the rest is the header JSON. Accepted headers must describe tensors that lie inside
// the data, do not overlap, and whose byte length is numel x element size.
#include <cstdint>
#include <cstring>
#include <string_view>

#include "fuzz_common.hpp"
#include "headwise/io/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace headwise;
  if (size < 8) return 0;
  uint64_t data_size = 0;
  std::memcpy(&data_size, data, 8);
  const std::string_view header(reinterpret_cast<const char*>(data + 8), size - 8);
  fuzz::expect_accept_or_input_error([&] {
    const auto tensors = io::parse_safetensors_header(header, data_size, "fuzz.safetensors");
    for (const auto& t : tensors) {
      if (t.begin > t.end || t.end > data_size)
        fuzz::fail("accepted a tensor outside the data section");
      if (t.numel() < 0) fuzz::fail("accepted a negative element count");
      const auto element = static_cast<uint64_t>(element_size(t.dtype));
      if (static_cast<uint64_t>(t.numel()) * element != t.end - t.begin)
        fuzz::fail("accepted a size mismatch");
    }
  });
  return 0;
}
