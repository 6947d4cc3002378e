#pragma once
// What a requested context means against the positions a model's config says it was built for.
// A policy for 256K on a model whose config stops at 128K calibrates and estimates without
// complaint, and then serves positions the model never saw; users should hear that from the tool
// that wrote the policy, with the field to look at.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "headwise/arch/model_spec.hpp"

namespace headwise::arch {

// Rotary angles are built from positions in fp32, which holds integers exactly only up to 2^24:
// beyond it neighbouring positions get the same angle.
inline constexpr int64_t kMaxRepresentablePosition = int64_t{1} << 24;

struct ContextLimit {
  int64_t max_position_embeddings = 0;  // the text config's, 0 when it states none
  std::string rope;                     // "linear x8", "yarn x4 (from 32768)", ... or "default"
};

// The text config's max_position_embeddings and its RoPE scaling (rope_parameters or the legacy
// rope_scaling, per layer type where the config splits them), for messages.
ContextLimit context_limit(const ModelSpec& spec);

// InputError naming `flag` when `context` is not positive or beyond kMaxRepresentablePosition;
// otherwise a warning when it exceeds max_position_embeddings (naming that field of `where`,
// usually <model>/config.json, and the RoPE scaling), or nullopt when it fits.
std::optional<std::string> check_context(const ModelSpec& spec, int64_t context,
                                         std::string_view flag, std::string_view where);

}  // namespace headwise::arch
