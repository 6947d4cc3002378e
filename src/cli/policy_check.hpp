#pragma once
// Shared by the subcommands that run a policy on a model (eval, forward --policy).
#include <filesystem>
#include <string>

#include "headwise/arch/model_spec.hpp"
#include "headwise/core/error.hpp"
#include "headwise/policy/policy.hpp"

namespace headwise::cli {

// A policy carries its model's fingerprint; quality numbers (or logits) for another model's
// policy would be meaningless, so refuse before any work.
inline void check_policy_matches(const policy::Policy& p, const std::filesystem::path& dir,
                                 const arch::ModelSpec& spec, const std::string& where,
                                 const char* flag = "--policy") {
  const auto fp = policy::fingerprint_model(dir);
  if (p.fingerprint.config_sha256 != fp.config_sha256) {
    throw_input_error(
        "{} {}: model_fingerprint.config_sha256 does not match {} (a policy for another model)",
        flag, where, (dir / "config.json").string());
  }
  if (p.fingerprint.weights_headers_sha256 && fp.weights_headers_sha256 &&
      *p.fingerprint.weights_headers_sha256 != *fp.weights_headers_sha256) {
    throw_input_error(
        "{} {}: model_fingerprint.weights_headers_sha256 does not match the safetensors in {} "
        "(recalibrate for these weights)",
        flag, where, dir.string());
  }
  policy::validate_against_model(p, spec, where);
}

}  // namespace headwise::cli
