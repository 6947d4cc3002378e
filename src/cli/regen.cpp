// `headwise-calc regen --manifest FILE [--check] [--only NAME] [--quiet]`: rebuilds the
// policies a manifest lists with the main command's own calibration code path.
//  - without --check: an entry whose policy records the same inputs_sha256 as the entry now
//    hashes to is skipped (the hash covers the tool's calibration revision, so it would come out
//    the same); others, and every entry with --force, are recalibrated and written
//    atomically (with a resume checkpoint, like the main command);
//  - with --check: nothing is written. The entries the manifest's recalibrate_on_check names
//    (every entry without that key, or with --all) are recalibrated, and a committed policy that
//    differs from what its entry produces is printed as a diff; every other entry is checked by
//    its fingerprint (fingerprint_check below), which takes milliseconds instead of minutes.
//    Exit 1 if any policy is stale or differs.
// It runs in the manifest's folder, so the paths a policy records do not depend on the
// caller's working directory.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <set>

#include "headwise/arch/registry.hpp"
#include "headwise/calib/calibration_job.hpp"
#include "headwise/cli/command.hpp"
#include "headwise/core/error.hpp"
#include "headwise/core/files.hpp"
#include "headwise/io/checkpoint.hpp"
#include "headwise/regen/manifest.hpp"
#include "headwise/regen/policy_diff.hpp"

namespace headwise::cli {
namespace {
namespace fs = std::filesystem;

struct RegenArgs {
  std::string manifest;
  bool check = false;
  bool all = false;
  bool force = false;
  std::vector<std::string> only;
  CommonFlags flags;
};

// Restores the caller's working directory however regen ends.
class WorkingDirectory {
 public:
  explicit WorkingDirectory(const fs::path& dir) : previous_(fs::current_path()) {
    fs::current_path(dir);
  }
  ~WorkingDirectory() {
    std::error_code ec;
    fs::current_path(previous_, ec);
  }

 private:
  fs::path previous_;
};

std::optional<std::string> recorded_inputs_hash(const fs::path& output) {
  std::error_code ec;
  if (!fs::exists(output, ec)) return std::nullopt;
  try {
    const policy::Policy p = policy::read_policy(output);
    if (p.calibration.contains("inputs_sha256") && p.calibration["inputs_sha256"].is_string()) {
      return p.calibration["inputs_sha256"].get<std::string>();
    }
  } catch (const InputError& e) {
    spdlog::warn("{}: unreadable policy, will be regenerated ({})", output.string(), e.what());
  }
  return std::nullopt;
}

// Prints how the committed policy differs from `produced`; returns false when it does. The bytes
// must be equal: calibration pins one CPU math branch (core/reproducible_math.hpp), so the same
// inputs give the same expected_distortion digits on every x86-64 CPU with AVX2 and FMA.
bool compare(const regen::ManifestEntry& entry, const calib::CalibrationOutcome& produced,
             bool quiet) {
  std::error_code ec;
  if (!fs::exists(entry.output, ec)) {
    std::cout << fmt::format("{}: {} is missing (run `headwise-calc regen` to create it)\n",
                             entry.name, entry.output.string());
    return false;
  }
  const std::string committed_text = read_text_file(entry.output);
  if (committed_text == produced.policy_yaml) {
    if (!quiet)
      std::cout << fmt::format("{}: {} is up to date\n", entry.name, entry.output.string());
    return true;
  }
  std::vector<std::string> lines;
  try {
    const policy::Policy committed = policy::from_yaml(committed_text, entry.output.string());
    lines = regen::diff_policies(
        committed, produced.policy,
        arch::load_model_spec(io::resolve_model_dir(entry.request.at("model"))));
  } catch (const InputError& e) {
    lines.push_back(fmt::format("the committed file is not a valid policy: {}", e.what()));
  }
  std::cout << fmt::format("{}: {} differs from what the manifest entry produces:\n", entry.name,
                           entry.output.string());
  if (lines.empty())
    lines.push_back(regen::first_text_difference(committed_text, produced.policy_yaml));
  for (const auto& line : lines) std::cout << "  " << line << "\n";
  return false;
}

// The cheap check of an entry regen --check does not recalibrate: the committed policy must be
// the writer's own text (a hand edit of the layout, or a reader/writer change, shows), record
// the inputs_sha256 the entry hashes to now (model config and safetensors headers, calibration
// data, every option, the tool version and calibration revision), and agree with the model
// (layers, heads, ladder, the memory block). What it cannot see: a change of what the
// calibration code computes without a revision bump (the recalibrated entries catch it) and a
// hand edit of windows or distortions that keeps the memory block consistent (--all catches it).
bool fingerprint_check(const regen::ManifestEntry& entry, const calib::CalibrationJob& job,
                       bool quiet) {
  std::error_code ec;
  if (!fs::exists(entry.output, ec)) {
    std::cout << fmt::format("{}: {} is missing (run `headwise-calc regen` to create it)\n",
                             entry.name, entry.output.string());
    return false;
  }
  const std::string text = read_text_file(entry.output);
  std::string problem;
  try {
    const policy::Policy p = policy::from_yaml(text, entry.output.string());
    const std::string recorded = p.calibration.value("inputs_sha256", std::string());
    if (policy::to_yaml(p) != text) {
      problem = fmt::format("not as headwise writes it ({})",
                            regen::first_text_difference(text, policy::to_yaml(p)));
    } else if (recorded != job.inputs_hash()) {
      problem = fmt::format(
          "its inputs changed since it was made (inputs_sha256 {} recorded, {} now: model, data, "
          "options, tool or calibration revision)",
          recorded.empty() ? "(none)" : recorded.substr(0, 12), job.inputs_hash().substr(0, 12));
    } else {
      policy::validate_against_model(
          p, arch::load_model_spec(io::resolve_model_dir(entry.request.at("model"))),
          entry.output.string());
    }
  } catch (const InputError& e) {
    problem = fmt::format("not a valid policy for its model: {}", e.what());
  }
  if (problem.empty()) {
    if (!quiet) {
      std::cout << fmt::format(
          "{}: {} is up to date (inputs unchanged: inputs_sha256 {}; not recalibrated)\n",
          entry.name, entry.output.string(), job.inputs_hash().substr(0, 12));
    }
    return true;
  }
  std::cout << fmt::format("{}: {} is stale: {}\n", entry.name, entry.output.string(), problem);
  return false;
}

// Policies in the manifest's folder that no entry lists: `--check` cannot vouch for them, so a
// committed policy would silently go stale. A file is a policy when its schema line says so.
std::vector<std::string> unlisted_policies(const regen::Manifest& manifest,
                                           const fs::path& manifest_path) {
  std::set<fs::path> listed{fs::weakly_canonical(manifest_path)};
  for (const auto& e : manifest.entries)
    listed.insert(fs::weakly_canonical(manifest.folder / e.output));
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(manifest.folder)) {
    const fs::path& p = entry.path();
    if (!entry.is_regular_file() || p.extension() != ".yaml" ||
        listed.contains(fs::weakly_canonical(p)))
      continue;
    if (read_text_file(p).find("schema: headwise/policy/") != std::string::npos)
      out.push_back(p.filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

void run_regen(const RegenArgs& args) {
  apply_logging(args.flags);
  const regen::Manifest manifest = regen::read_manifest(args.manifest);
  if (args.all && !args.check)
    throw_input_error("--all: only with --check (plain regen rebuilds what changed; --force all)");
  regen::check_recalibration_coverage(manifest);
  for (const auto& name : args.only) {
    if (std::none_of(manifest.entries.begin(), manifest.entries.end(),
                     [&](const auto& e) { return e.name == name; })) {
      std::vector<std::string> names;
      for (const auto& e : manifest.entries) names.push_back(e.name);
      throw_input_error("--only: no entry '{}' in {} (entries: {})", name, args.manifest,
                        fmt::join(names, ", "));
    }
  }
  if (args.check && args.only.empty()) {
    if (const auto unlisted = unlisted_policies(manifest, args.manifest); !unlisted.empty()) {
      throw_input_error(
          "regen --check: {} in {} {} not listed in {}: add an entry for it or move it elsewhere",
          fmt::join(unlisted, ", "), manifest.folder.string(),
          unlisted.size() == 1 ? "is a policy" : "are policies", args.manifest);
    }
  }
  const WorkingDirectory in_manifest_folder(manifest.folder);
  std::vector<std::string> stale;
  size_t considered = 0;
  for (const auto& entry : manifest.entries) {
    if (!args.only.empty() &&
        std::find(args.only.begin(), args.only.end(), entry.name) == args.only.end())
      continue;
    ++considered;
    std::optional<calib::CalibrationJob> job;
    try {
      job.emplace(calib::parse_calibration_options(entry.request), entry.output);
    } catch (const FieldError& e) {
      throw e.prefixed(fmt::format("{}: entry '{}': ", args.manifest, entry.name));
    } catch (const InputError& e) {
      // The job names flags (--context); say which manifest entry they came from.
      throw_input_error("{}: entry '{}': {}", args.manifest, entry.name, e.what());
    }
    if (args.check) {
      const bool fresh = args.all || manifest.recalibrated_on_check(entry.name)
                             ? compare(entry, job->run(calib::RunControl{}), args.flags.quiet)
                             : fingerprint_check(entry, *job, args.flags.quiet);
      if (!fresh) stale.push_back(entry.name);
      continue;
    }
    if (!args.force && recorded_inputs_hash(entry.output) == job->inputs_hash()) {
      if (!args.flags.quiet)
        std::cout << fmt::format("{}: {} skipped: inputs unchanged (inputs_sha256 {})\n",
                                 entry.name, entry.output.string(),
                                 job->inputs_hash().substr(0, 12));
      continue;
    }
    calib::RunControl control;
    control.checkpoint = calib::checkpoint_path_for(entry.output);
    const calib::CalibrationOutcome out = job->run(control);
    write_file_atomically(entry.output, out.policy_yaml);
    std::error_code ec;
    fs::remove(control.checkpoint, ec);
    if (!args.flags.quiet)
      std::cout << fmt::format("{}: {} regenerated in {:.1f}s\n", entry.name, entry.output.string(),
                               out.seconds);
  }
  if (!stale.empty()) {
    // --force: the inputs may be unchanged and the tool not (then a plain regen would skip them).
    throw_input_error(
        "regen --check: {} of {} policies differ from {} ({}); run `headwise-calc regen --manifest "
        "{} "
        "--force --only NAME` for each and commit the result",
        stale.size(), considered, args.manifest, fmt::join(stale, ", "), args.manifest);
  }
}

const RegisterCommand kRegister{
    "regen", [](CLI::App& root) {
      static RegenArgs args;
      CLI::App* app = root.add_subcommand("regen",
                                          "Rebuild the policies a manifest lists (CI: --check "
                                          "fails when a committed policy is stale or edited)");
      app->add_option("--manifest", args.manifest,
                      "Manifest YAML (policies/manifest.yaml); its paths are relative to it")
          ->required();
      app->add_flag("--check", args.check,
                    "Write nothing; exit 1 when a committed policy is stale or differs: entries in "
                    "the manifest's "
                    "recalibrate_on_check (all without it) are recalibrated and diffed, the others "
                    "checked by their "
                    "inputs fingerprint");
      app->add_flag(
          "--all", args.all,
          "With --check: recalibrate every entry (catches hand edits a fingerprint cannot)");
      app->add_option("--only", args.only, "Only the entry with this name (repeatable)");
      app->add_flag(
          "--force", args.force,
          "Recalibrate even entries whose inputs are unchanged (after a change of the tool)");
      add_common_flags(app, args.flags, /*with_json=*/false);
      app->callback([] { run_regen(args); });
    }};

}  // namespace
}  // namespace headwise::cli
