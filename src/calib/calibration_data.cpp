#include "headwise/calib/calibration_data.hpp"

#include "headwise/calib/synthetic.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"

namespace headwise::calib {

std::string token_ids_sha256(const std::vector<std::vector<int64_t>>& sequences) {
  std::string bytes;
  for (const auto& seq : sequences) {
    bytes.append(reinterpret_cast<const char*>(seq.data()), seq.size() * sizeof(int64_t));
  }
  return sha256_hex(bytes);
}

CalibrationData load_calibration_data(const std::string& calib_path, const std::filesystem::path& model_dir,
                                      int64_t vocab_size, int64_t samples, int64_t seq_len, uint64_t seed) {
  CalibrationData data;
  if (calib_path.empty()) {
    SyntheticOptions options{vocab_size, samples, seq_len, seed};
    data.sequences = synthetic_retrieval_set(options);
    data.description = synthetic_set_description(options);
    data.sha256 = token_ids_sha256(data.sequences);
    return data;
  }
  throw_unsupported("--calib {}: file input arrives with the dataset reader", calib_path);
}

}  // namespace headwise::calib
