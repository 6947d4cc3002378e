#pragma once
// What the eval tests share: headwise-calc run as a child process, fixture policies as `calibrate`
// would write them (windows given), and reading the rows of eval --json.
#include <sys/wait.h>
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "../support/test_paths.hpp"
#include "headwise/arch/model_spec.hpp"
#include "headwise/core/files.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::testing {

struct Run {
  int status = 0;
  std::string out;
  std::string err;
};

// `env`: assignments put before the command ("OMP_NUM_THREADS=4").
inline Run run_cli(const std::string& args, const std::filesystem::path& scratch,
                   const std::string& env = "") {
  const std::filesystem::path err_file = scratch / "stderr.txt";
  const std::string command = (env.empty() ? "" : "env " + env + " ") + std::string(HEADWISE_CLI) +
                              " " + args + " 2>" + err_file.string();
  Run r;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) r.out.append(buffer, n);
  const int status = pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_text_file(err_file);
  return r;
}

inline memory::HeadWindows random_policy_windows(const arch::ModelSpec& spec,
                                                 const std::vector<int64_t>& ladder,
                                                 std::mt19937_64& rng) {
  memory::HeadWindows out;
  for (int64_t id : spec.global_layer_ids()) {
    for (int64_t h = 0; h < spec.layer(id).attention->num_kv_heads; ++h) {
      out[id].push_back(ladder[std::uniform_int_distribution<size_t>(0, ladder.size() - 1)(rng)]);
    }
  }
  return out;
}

// A policy for a fixture model, as `calibrate` would write it (windows given).
inline policy::Policy fixture_policy(const std::filesystem::path& dir,
                                     const memory::HeadWindows& windows) {
  const auto spec = arch::load_model_spec(dir);
  policy::Policy p;
  p.model_name = dir.filename().string();
  p.model_path = dir.string();
  p.fingerprint = policy::fingerprint_model(dir);
  p.budget_gb = 1;
  p.context = 256;
  p.dtype = DType::kFloat32;
  p.block_size = 16;
  p.sink_tokens = 2;
  p.window_levels = {8, 32, policy::kFull};
  for (const auto& [layer, heads] : windows) p.per_layer_policies.push_back({layer, heads, {}, {}});
  policy::fill_memory(p, spec);
  return p;
}

// An online eviction method's row (h2o, snapkv, adakv, pyramidkv, the chunked variants and the
// *-headwise-slots ablations): only those report the measured bookkeeping of the eviction cache.
inline bool is_eviction_row(const nlohmann::json& m) {
  return m.contains("details") && m["details"].contains("auxiliary_bytes_measured");
}

// The row of method `name` in eval --json's output; fails the test when there is none.
inline const nlohmann::json& method_row(const nlohmann::json& j, const std::string& name) {
  for (const auto& m : j.at("methods")) {
    if (m.at("name") == name) return m;
  }
  FAIL("no method " << name);
  return j;
}

}  // namespace headwise::testing
