#pragma once
// policies/manifest.yaml: the policies a project keeps, and how to rebuild each.
//
//   policies:
//     - name: tiny-qwen3-next              # unique; [A-Za-z0-9._-]
//       model: ../models/tiny-qwen3-next   # folder, relative to the manifest's folder
//       context: 32k
//       budget: 8m
//       windows: 64,256,1k,full            # or a list: [64, 256, 1k, full]
//       calib: data/calib.jsonl            # optional; omitted = built-in synthetic set
//       samples: 4                         # optional (8); with seq_len, for the synthetic set
//       seq_len: 2k                        # optional (auto)
//       seed: 0
//       output: tiny-qwen3-next.yaml       # relative to the manifest's folder
//       # optional: every other calibration option by its field name (calibration_options.hpp:
//       # visit_fields), with the main command's text: block_size, batch, sink_tokens, kv_dtype,
//       # dtype, device, micro_batch, probe_samples, attention_chunk, conditioning (bool: false
//       # is --no-conditioning), distortion, joint_heads (bool: false is --independent-heads),
//       # re_solve (span, rewalk: --re-solve-by-rewalk), span_margin, extrapolate, keep_rules
//       # (auto), prefill_chunk, state_dtype (float32; native for policies made before the
//       # option), validate_measure, activations
//
//   recalibrate_on_check: [tiny-qwen3-next]  # optional; see below
//
// `regen --check` recalibrates the entries `recalibrate_on_check` names and checks every other
// one by its fingerprint (the inputs_sha256 it records must equal what the entry hashes to now:
// model, data, options, tool and calibration revision; the file must be as headwise writes it
// and agree with the model's memory). Without the key every entry is recalibrated. The list must
// cover every distortion measure, keep-rules choice and method (conditioned or not) the entries
// use, so a change of the calibration code that a fingerprint cannot see still fails CI.
//
// The reader is strict: unknown or missing keys, wrong types, duplicate names or outputs are
// InputErrors naming the file, the entry and the key.
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "headwise/calib/calibration_options.hpp"

namespace headwise::regen {

struct ManifestEntry {
  std::string name;
  // The calibration fields the entry gives, as text; paths (model, calib) joined to `base`.
  calib::CalibrationRequest request;
  std::filesystem::path output;  // idem
};

struct Manifest {
  std::filesystem::path path;
  std::filesystem::path folder;  // absolute; read_manifest's relative paths start here
  std::vector<ManifestEntry> entries;
  // Entry names `regen --check` recalibrates; nullopt (no key): every entry.
  std::optional<std::vector<std::string>> recalibrate_on_check;

  // Whether `regen --check` recalibrates `name` (else: its fingerprint is checked).
  bool recalibrated_on_check(const std::string& name) const;
};

// What an entry's calibration runs, for the coverage rule of recalibrate_on_check: the resolved
// distortion measure, keep rules and method ("answer-tv", "window,h2o", "seqcalib").
struct CalibrationKind {
  std::string measure;
  std::string keep_rules;
  std::string method;
};
CalibrationKind calibration_kind(const calib::CalibrationRequest& request);

// InputError (naming the manifest, the key and the uncovered value with the entries that use it)
// when recalibrate_on_check leaves a measure, keep-rules choice or method of some entry uncovered.
void check_recalibration_coverage(const Manifest& manifest);

// `where` names the source in errors; relative paths are joined to `base` (empty: kept as
// written, relative to the manifest's folder).
Manifest parse_manifest(std::string_view text, std::string_view where,
                        const std::filesystem::path& base);
Manifest read_manifest(const std::filesystem::path& path);

}  // namespace headwise::regen
