// eval --json against what is computed here: measured == estimated bytes for every method, full KV
// has KL 0, and the reported accuracies, KL and perplexity equal a teacher-forced masked forward.
#include <c10/core/InferenceMode.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "../arch/fixture_reference.hpp"
#include "../support/test_paths.hpp"
#include "../test_configs.hpp"
#include "eval_helpers.hpp"
#include "headwise/calib/seqcalib.hpp"
#include "headwise/eval/baselines.hpp"
#include "headwise/eval/eval.hpp"
#include "headwise/eval/tasks.hpp"
#include "headwise/policy/policy.hpp"

using namespace headwise;
namespace fs = std::filesystem;
using headwise::testing::fixture_policy;
using headwise::testing::is_eviction_row;
using headwise::testing::method_row;
using headwise::testing::Run;
using headwise::testing::run_cli;

namespace {

// Logits of `tokens` [1, T] with `windows` applied as masks over one full-sequence call (the
// calibration's PolicyAttentionCore), or the plain forward for full KV: no cache, no chunks, no
// greedy loop, apart from the runtime decoder eval runs.
at::Tensor masked_logits(arch::DecoderModel& model, const std::vector<int64_t>& tokens,
                         const memory::HeadWindows& windows, int64_t sink_tokens) {
  c10::InferenceMode inference;
  const at::Tensor ids = at::tensor(tokens, at::TensorOptions().dtype(at::kLong)).view({1, -1});
  calib::PolicyAttentionCore core(windows, sink_tokens, 64);
  at::Tensor hidden = model.embed(ids);
  arch::LayerRun run;
  run.attention = &core;
  for (int64_t i = 0; i < model.spec().num_layers(); ++i) hidden = model.run_layer(i, hidden, run);
  return model.logits(hidden)[0];  // [T, V]
}

struct Recomputed {
  std::map<std::string, std::pair<int64_t, int64_t>> counts;  // task → (right, total)
  std::vector<at::Tensor> tails;                              // per sample: last k prompt log-probs
  double nll = 0;
  int64_t nll_tokens = 0;
};

// What eval reports for one method, recomputed from teacher-forced logits: a sample is right when
// the argmax at every answer row is the answer token (greedy decoding produces the answer exactly
// iff it does), perplexity over the prompts' next tokens, and the last `kl_positions` prompt rows.
Recomputed recompute(arch::DecoderModel& model, const std::vector<eval::EvalSample>& samples,
                     const memory::HeadWindows& windows, int64_t kl_positions,
                     int64_t sink_tokens = 0) {
  Recomputed r;
  for (const auto& s : samples) {
    const eval::TeacherForced tf = eval::teacher_forced(s);
    const at::Tensor logp =
        at::log_softmax(masked_logits(model, tf.tokens, windows, sink_tokens).to(at::kDouble), -1);
    bool right = true;
    for (size_t i = 0; i < s.answer.size(); ++i) {
      right =
          right && logp[tf.first_answer_row + static_cast<int64_t>(i)].argmax().item<int64_t>() ==
                       s.answer[i];
    }
    auto& [hits, total] = r.counts[s.task];
    hits += right ? 1 : 0;
    ++total;
    const auto p = static_cast<int64_t>(s.prompt.size());
    for (int64_t t = 0; t + 1 < p; ++t)
      r.nll -= logp[t][s.prompt[static_cast<size_t>(t + 1)]].item<double>();
    r.nll_tokens += p - 1;
    r.tails.push_back(logp.slice(0, p - std::min(kl_positions, p), p));
  }
  return r;
}

memory::HeadWindows windows_of(const nlohmann::json& row) {
  memory::HeadWindows out;
  for (const auto& [layer, heads] : row.at("windows").items()) {
    for (const auto& w : heads)
      out[std::stoll(layer)].push_back(w.is_string() ? kFullWindow : w.get<int64_t>());
  }
  return out;
}

// Mean KL(full || method) per compared position, from the recomputed log-probabilities.
double kl_to_full(const Recomputed& full, const Recomputed& method) {
  double kl = 0;
  int64_t positions = 0;
  for (size_t i = 0; i < full.tails.size(); ++i) {
    kl += (full.tails[i].exp() * (full.tails[i] - method.tails[i])).sum().item<double>();
    positions += full.tails[i].size(0);
  }
  return kl / static_cast<double>(positions);
}

}  // namespace

TEST_CASE("eval --json: every method, measured == estimated bytes, full has KL 0", "[eval]") {
  // Every hybrid family with a forward: gated DeltaNet (Qwen3-Next, Qwen3.5-MoE), gpt-oss (sliding
  // layers, sink logits), LFM2 (short convolutions), the Mamba-2 hybrids (Bamba, Nemotron-H,
  // Granite 4.0-H, Falcon-H1) and Jamba (Mamba-1).
  const auto fixture = GENERATE(as<std::string>{}, "qwen3_next_tiny", "qwen3_5_moe_tiny",
                                "gpt_oss_tiny", "lfm2_tiny", "bamba_tiny", "nemotron_h_tiny",
                                "granitemoehybrid_tiny", "jamba_tiny", "falcon_h1_tiny");
  INFO(fixture);
  headwise::testing::TempDir tmp;
  const auto dir = headwise::testing::fixture_dir(fixture);
  const auto spec = arch::load_model_spec(dir);
  // Windows full, 8, 32, full, 8, ... over the global KV heads: every window kind, and bytes at
  // which every baseline fits on every family (duo's streaming heads keep 32 sink + 64 recent
  // tokens at this context; the fixtures' smallest mean is 107 tokens per head).
  memory::HeadWindows windows;
  size_t head = 0;
  for (int64_t id : spec.global_layer_ids()) {
    for (int64_t h = 0; h < spec.layer(id).attention->num_kv_heads; ++h, ++head) {
      windows[id].push_back(std::vector<int64_t>{policy::kFull, 8, 32}[head % 3]);
    }
  }
  const auto p = fixture_policy(dir, windows);
  policy::write_policy(tmp.path() / "policy.yaml", p);
  // Few duo steps: this case checks every method's rows and bytes, not the gates' quality.
  // 240-token samples: at these bytes the methods at their own allocation keep about 110 tokens
  // per head, so they truncate much of every sample, not only its first few tokens.
  const Run r = run_cli(
      "eval --model " + dir.string() + " --policy " + (tmp.path() / "policy.yaml").string() +
          " --samples 2 --calib-samples 2 --duo-steps 8 --seq-len 240 --prefill-chunk 50 --json"
          " --quiet",
      tmp.path());
  INFO(r.err);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  const int64_t budget = j["policy_global_kv_bytes"], tolerance = j["one_block_per_head_bytes"];
  // KL to full KV, computed another way: the same samples through a full-sequence forward with
  // each static method's windows as masks (no cache, no chunks, no decoder).
  const auto samples =
      eval::make_eval_samples(dir, spec.vocab_size, eval::TaskRequest{{}, 2, 240, /*seed=*/0});
  auto model = arch::load_model(dir, arch::ModelOptions{});
  const int64_t kl_positions = 512;  // eval's default: every prompt position here
  const Recomputed full_kv =
      recompute(*model, samples, memory::full_kv_windows(spec), kl_positions);
  // Every method ran, in order: at these bytes each baseline has a configuration that fits.
  CHECK(j.at("methods_not_fitting").empty());
  std::vector<std::string> names;
  for (const auto& m : j["methods"]) names.push_back(m["name"]);
  CHECK(names == eval::method_names());
  const int64_t policy_bytes = j["methods"][0]["cache_bytes_estimated"];
  for (const auto& m : j["methods"]) {
    INFO(m.dump());
    CHECK(m["cache_bytes_measured"] == m["cache_bytes_estimated"]);
    CHECK(m["tasks"].size() == eval::default_tasks(dir).size());
    for (const auto& [task, acc] : m["tasks"].items())
      CHECK((acc.get<double>() >= 0 && acc.get<double>() <= 1));
    const int64_t bytes = m["global_kv_bytes"];
    const std::string name = m["name"];
    const double kl = m["kl_vs_full"].get<double>();
    if (is_eviction_row(m)) {
      // SnapKV, AdaKV and PyramidKV staged compute the prompt's logits at full KV before they
      // compress, so they equal full KV's there; H2O and the chunked rules evict during prefill.
      const bool staged = !name.starts_with("h2o") && name.find("chunked") == std::string::npos;
      if (staged) {
        CHECK(kl == Approx(0.0).margin(1e-12));
      } else {
        // No reference short of reimplementing the eviction: they must at least differ from full
        // KV, which a run that evicted nothing (or reported the full run's KL) would not.
        CHECK(kl > 0.0);
      }
    } else if (name != "full") {
      const auto& details = m.value("details", nlohmann::json::object());
      const int64_t sinks = details.value("sink_tokens", p.sink_tokens);
      const Recomputed masked = recompute(*model, samples, windows_of(m), kl_positions, sinks);
      // float32 noise: a few 1e-9 absolute on these random-weight fixtures, whose KLs are 1e-8 to
      // 1e-3 (measured: every static row of every fixture within 8e-9 or 1e-5 relative).
      CHECK(kl == Approx(kl_to_full(full_kv, masked)).epsilon(1e-2).margin(3e-8));
    }
    const bool on_policy_slots = name.ends_with("-headwise-slots");
    if (name == "full") {
      CHECK(m["kl_vs_full"].get<double>() == 0.0);
    } else if (name == "headwise") {
      CHECK(bytes == budget);
    } else if (is_eviction_row(m)) {
      const auto& d = m.at("details");
      CHECK(d.at("method") == name);
      const int64_t bookkeeping = d.at("auxiliary_bytes_measured");
      CHECK(bookkeeping > 0);
      // The bookkeeping is part of the method's bytes, as the policy's own is of its.
      CHECK(m["cache_bytes_measured"].get<int64_t>() - bookkeeping ==
            j["methods"][1]["cache_bytes_measured"].get<int64_t>() -
                j["methods"][1]["global_kv_bytes"].get<int64_t>() + bytes);
      if (on_policy_slots) {
        // The ablation: the policy's own slots, so its K/V bytes exactly and its bookkeeping on
        // top.
        CHECK(bytes == budget);
        CHECK(m["cache_bytes_estimated"].get<int64_t>() > policy_bytes);
      } else {
        // As published: its own allocation of the policy's bytes, bookkeeping included.
        CHECK(m["cache_bytes_estimated"].get<int64_t>() <= policy_bytes);
      }
      // SnapKV/AdaKV/PyramidKV stage the prompt's K/V before compressing (full KV at the prefill
      // peak); chunked, they compress after every prefill chunk and stage nothing, as H2O.
      const bool staged = !name.starts_with("h2o") && name.find("chunked") == std::string::npos;
      CHECK((d.at("prefill_staged_peak_bytes_measured").get<int64_t>() > 0) == staged);
    } else if (name == "unconditioned") {
      CHECK(bytes <= budget);  // ladder levels only, like the policy itself
    } else {
      // Static windows (a window needs no bookkeeping): the policy's bytes, within one block per
      // head.
      CHECK(m["cache_bytes_estimated"].get<int64_t>() <= policy_bytes);
      CHECK(policy_bytes - m["cache_bytes_estimated"].get<int64_t>() < tolerance);
    }
  }
  CHECK(j["methods"][0]["cache_bytes_estimated"] == p.memory.total_bytes);
  // headwise against every other method on the same samples.
  for (const auto& name : {"full", "uniform", "unconditioned"}) {
    INFO(name);
    const auto& paired = j.at("paired_vs_headwise").at(name);
    CHECK(paired.at("samples").get<int64_t>() > 0);
    CHECK(paired.at("mcnemar_p").get<double>() <= 1.0);
  }
  CHECK_FALSE(j.at("paired_vs_headwise").contains("headwise"));
}

TEST_CASE(
    "eval's accuracies, KL and perplexity equal a teacher-forced masked forward computed here",
    "[eval]") {
  // The 2K default model, trained on these tasks (accuracies are neither all 0 nor all 1), under a
  // policy with float32 K/V and states: the decoder then computes what the masked reference does,
  // so every figure must agree (counts exactly, KL and perplexity to float rounding).
  headwise::testing::TempDir tmp;
  const fs::path dir = fs::path(HEADWISE_SOURCE_DIR) / "models" / "tiny-qwen3-next";
  const auto spec = arch::load_model_spec(dir);
  policy::Policy p =
      fixture_policy(dir, {{1, {32, kFullWindow, 32, 64}}, {3, {64, 32, kFullWindow, 32}}});
  p.context = 512;
  p.sink_tokens = 0;
  p.state_dtype = DType::kFloat32;
  p.window_levels = {32, 64, kFullWindow};
  policy::fill_memory(p, spec);
  policy::write_policy(tmp.path() / "policy.yaml", p);
  const int64_t kl_positions = 100;
  const Run r = run_cli("eval --model " + dir.string() + " --policy " +
                            (tmp.path() / "policy.yaml").string() +
                            " --baselines full,uniform --tasks needle_single,needle_multikey "
                            "--samples 6 --seq-len 320"
                            " --prefill-chunk 64 --kl-positions " +
                            std::to_string(kl_positions) + " --json --quiet",
                        tmp.path());
  INFO(r.err);
  REQUIRE(r.status == 0);
  const auto j = nlohmann::json::parse(r.out);
  CHECK(j.at("state_dtype") == "float32");

  eval::TaskRequest request{
      {"needle_single", "needle_multikey"}, 6, 320, 0};  // eval's defaults: seed 0
  const auto samples = eval::make_eval_samples(dir, spec.vocab_size, request);
  auto model = arch::load_model(dir, arch::ModelOptions{});
  const Recomputed full = recompute(*model, samples, memory::full_kv_windows(spec), kl_positions);
  int64_t right_anywhere = 0, wrong_anywhere = 0;
  for (const char* name : {"full", "headwise", "uniform"}) {
    const auto& row = method_row(j, name);
    INFO(name << ": " << row.dump());
    const Recomputed mine = recompute(*model, samples, windows_of(row), kl_positions);
    for (const auto& [task, counts] : mine.counts) {
      CHECK(row.at("tasks_counts").at(task).at("right") == counts.first);
      CHECK(row.at("tasks_counts").at(task).at("total") == counts.second);
      CHECK(row.at("tasks").at(task).get<double>() ==
            Approx(static_cast<double>(counts.first) / counts.second));
      right_anywhere += counts.first;
      wrong_anywhere += counts.second - counts.first;
    }
    CHECK(row.at("perplexity").get<double>() ==
          Approx(std::exp(mine.nll / static_cast<double>(mine.nll_tokens))).epsilon(1e-5));
    CHECK(row.at("kl_vs_full").get<double>() ==
          Approx(kl_to_full(full, mine)).epsilon(1e-3).margin(1e-7));
  }
  // The comparison must be able to disagree: some answers right, some wrong.
  CHECK(right_anywhere > 0);
  CHECK(wrong_anywhere > 0);
}
