// Determinism under load: the same forward (and the same calibration) must give the same bits
// while the machine is busy. A forward that changes under load can flip a near-tie in SeqCalib
// on a busy CI runner, and then `regen --check` and `--resume` break. The test makes its own
// load (spinning threads and a GEMM loop with its own OpenMP team), runs every forward family
// at two intra-op threads, with the layer streaming's prefetch thread and page drops active,
// and asks for bit-identical logits every time, within parity tolerance of transformers.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <catch2/catch.hpp>

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "../cli/cli_helpers.hpp"
#include "fixture_reference.hpp"
#include "headwise/arch/attention.hpp"
#include "headwise/arch/model.hpp"

using namespace headwise;
using namespace headwise::testing;

namespace {

// Keeps every core busy until destroyed: plain floating-point spinners (more threads than
// cores, so the forward's threads are preempted mid-work) and a GEMM loop whose own OpenMP
// team competes with the forward's.
class MachineLoad {
 public:
  explicit MachineLoad(int spinners) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int i = 0; i < spinners * cores; ++i) threads_.emplace_back([this, i] { spin(i); });
    threads_.emplace_back([this] { multiply(); });
  }
  ~MachineLoad() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }
  MachineLoad(const MachineLoad&) = delete;
  MachineLoad& operator=(const MachineLoad&) = delete;

 private:
  void spin(int seed) {
    double x = 1.0 + seed;
    while (!stop_) {
      for (int k = 0; k < 100000; ++k) x = std::sqrt(x * 1.0000001 + 1e-9);
    }
    sink_ = x;
  }
  void multiply() {
    const at::Tensor a = at::rand({256, 256});
    while (!stop_) sink_ = (a.mm(a)).sum().item<double>();
  }

  std::atomic<bool> stop_{false};
  std::atomic<double> sink_{0};
  std::vector<std::thread> threads_;
};

// Sets the intra-op thread count for one scope (tools/test.sh runs suites at one thread).
class IntraOpThreads {
 public:
  explicit IntraOpThreads(int n) : saved_(at::get_num_threads()) { at::set_num_threads(n); }
  ~IntraOpThreads() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

// The fixture's logits with every layer streamed: the next layer prefetched on its thread
// while this one computes, each layer released (its mapped pages dropped) after use.
at::Tensor streamed_logits(const std::filesystem::path& fixture, const at::Tensor& ids) {
  c10::InferenceMode inference;
  auto model = arch::load_model(fixture, {});
  at::Tensor hidden = model->embed(ids);
  arch::ExactAttentionCore exact;
  for (int64_t i = 0; i < model->spec().num_layers(); ++i) {
    model->prefetch_layer(i + 1);
    hidden = model->run_layer(i, hidden, {&exact, nullptr, 0});
    model->release_layer(i);
  }
  return model->logits(hidden);
}

constexpr int kRunsPerFamily = 12;

// The fixture's reference tokens as a `--tokens` JSON file in `dir`.
std::filesystem::path write_reference_tokens(const std::filesystem::path& fixture,
                                             const std::filesystem::path& dir) {
  const at::Tensor ids = read_reference(fixture, "input_ids").flatten();
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < ids.size(0); ++i) tokens.push_back(ids[i].item<int64_t>());
  const auto path = dir / "ids.json";
  write_file_atomically(path, fmt::format("[{}]", fmt::join(tokens, ",")));
  return path;
}

// `headwise-calc forward` of `tokens` at OMP_NUM_THREADS=threads (with `env` added): the
// logits file's bytes.
std::string forward_bytes(const std::filesystem::path& fixture, const std::filesystem::path& tokens,
                          int threads, const std::string& env = "") {
  const auto out = tokens.parent_path() / "logits.safetensors";
  const auto result =
      run_cli_with("forward --model " + fixture.string() + " --tokens " + tokens.string() +
                       " -q -o " + out.string(),
                   (env.empty() ? "" : env + " ") + "OMP_NUM_THREADS=" + std::to_string(threads));
  INFO(result.err);
  REQUIRE(result.status == 0);
  return read_text_file(out);
}

// A small calibration of `fixture` (qwen3_next_tiny by default) at OMP_NUM_THREADS=threads: the
// policy's bytes. The budget binds (full KV is 256 KiB here), so the windows come from the
// measured distortions and a changed bit in them can show.
std::string calibrated_policy_bytes(const std::filesystem::path& dir, int threads,
                                    const std::string& fixture = "qwen3_next_tiny",
                                    const std::string& budget = "200k",
                                    const std::string& extra = "") {
  const auto out = dir / "policy.yaml";
  const auto result =
      run_cli_with("--model " + fixture_dir(fixture).string() +
                       " --context 512 --windows 8,32,full --seq-len 96 --samples 2 --budget " +
                       budget + " -q -o " + out.string() + " " + extra,
                   "OMP_NUM_THREADS=" + std::to_string(threads));
  INFO(result.err);
  REQUIRE(result.status == 0);
  return read_text_file(out);
}

}  // namespace

TEST_CASE("every family's forward gives the same bits under load, within parity of transformers",
          "[stress]") {
  const IntraOpThreads threads(2);
  const MachineLoad load(/*spinners=*/1);
  // One fixture per family with a forward; gemma3_gqa4's sliding window (23) is shorter than
  // its sequence (96), so the sliding mask is exercised.
  for (const char* name : {"gemma3_gqa4", "gemma3_softcap", "qwen3_next_tiny", "qwen3_5_text_tiny",
                           "qwen3_sliding", "llama_rope3", "llama_bias_tied", "qwen3_gqa"}) {
    INFO(name);
    const auto dir = fixture_dir(name);
    const at::Tensor ids = read_reference(dir, "input_ids");
    const at::Tensor reference = read_reference(dir, "logits_fp32");
    const at::Tensor first = run_fixture(dir, {});
    const ParityError parity = compare(first, reference);
    CHECK(parity.error <= 1e-4 * parity.scale);
    int differing = 0;
    for (int run = 0; run < kRunsPerFamily; ++run) {
      const at::Tensor again = run % 2 == 0 ? run_fixture(dir, {}) : streamed_logits(dir, ids);
      if (!at::equal(again, first)) {
        ++differing;
        UNSCOPED_INFO("run " << run << " differs by " << max_abs_diff(again, first));
      }
    }
    CHECK(differing == 0);
  }
}

TEST_CASE("headwise-calc forward under load writes the same logits every time", "[stress]") {
  // The production entry, not the library: its own process, thread pool and MKL set-up (a
  // row's bits depend on MKL's thread count: pin_cpu_math_threads). gemma3_gqa4: sliding
  // window 23 over 96 tokens.
  const MachineLoad load(/*spinners=*/1);
  TempDir dir("stress");
  const auto fixture = fixture_dir("gemma3_gqa4");
  const auto tokens = write_reference_tokens(fixture, dir.path());
  const std::string first = forward_bytes(fixture, tokens, 2);
  for (int run = 1; run < kRunsPerFamily; ++run) CHECK(forward_bytes(fixture, tokens, 2) == first);
}

TEST_CASE("a calibration under load writes the same policy bytes every time", "[stress]") {
  const MachineLoad load(/*spinners=*/1);
  TempDir dir("stress");
  const std::string first = calibrated_policy_bytes(dir.path(), 2);
  for (int run = 1; run < 3; ++run) CHECK(calibrated_policy_bytes(dir.path(), 2) == first);
}

TEST_CASE("headwise-calc forward gives the same bits at 1 to 16 intra-op threads", "[stress]") {
  // The cause of the rare flips under load: a GEMM's bits depend on the number of threads MKL
  // runs it on (it splits the sums differently), so a product computed on fewer threads than
  // usual changes the logits' last bits. libheadwise puts MKL in strict reproducibility mode
  // (MKL_CBWR=AUTO,STRICT, core/reproducible_math), where large GEMMs do not depend on the
  // thread count, and runs small ones (the MoE experts' few tokens: strict mode does not cover
  // them) on one MKL thread. A 2-core runner and a 16-core workstation must agree, so the counts
  // go past the cores. Without either (HEADWISE_MKL_STRICT=0) the MoE fixtures differ at 6+.
  TempDir dir("threads");
  int differing_without_strict = 0;
  for (const char* name :
       {"qwen3_next_tiny", "qwen3_5_moe_tiny", "bamba_tiny", "jamba_tiny", "granitemoehybrid_tiny",
        "falcon_h1_tiny", "gemma3_gqa4", "llama_rope3", "gpt_oss_tiny", "nemotron_h_tiny"}) {
    INFO(name);
    const auto fixture = fixture_dir(name);
    const auto tokens = write_reference_tokens(fixture, dir.path());
    const std::string one = forward_bytes(fixture, tokens, 1);
    for (int threads : {2, 3, 6, 16}) {
      INFO(threads << " threads");
      CHECK(forward_bytes(fixture, tokens, threads) == one);
    }
    // This process set MKL_CBWR for itself when libheadwise loaded; the child must not inherit it.
    const std::string default_mode = "-u MKL_CBWR HEADWISE_MKL_STRICT=0";
    const std::string default_one = forward_bytes(fixture, tokens, 1, default_mode);
    for (int threads : {2, 3, 6, 16}) {
      if (forward_bytes(fixture, tokens, threads, default_mode) != default_one) {
        ++differing_without_strict;
        break;
      }
    }
  }
  // Not a requirement (it depends on the CPU and MKL's kernels), but it shows that this test
  // can see what it guards against (measured on the 2-core machine: 6 of 10).
  WARN(differing_without_strict
       << " of 10 fixtures give other bits at 2-16 threads than at 1 in MKL's default mode");
}

TEST_CASE("a calibration writes the same policy bytes at 1 to 16 intra-op threads", "[stress]") {
  // Every measure and the keep-rules pass, on a dense-attention hybrid and on MoE models whose
  // experts see few tokens (the small GEMMs): a policy must be the same bytes on a 2-core CI
  // runner and a 16-core workstation.
  TempDir dir("threads");
  CHECK(calibrated_policy_bytes(dir.path(), 3) == calibrated_policy_bytes(dir.path(), 1));
  for (const auto& [fixture, extra] : std::vector<std::pair<std::string, std::string>>{
           {"qwen3_next_tiny", "--keep-rules window,h2o --prefill-chunk 16"},
           {"qwen3_5_moe_tiny", "--distortion block-mse"},
           {"gpt_oss_tiny", "--distortion answer-kl"},
           {"jamba_tiny", "--distortion answer-grad"}}) {
    INFO(fixture << " " << extra);
    const std::string one = calibrated_policy_bytes(dir.path(), 1, fixture, "100k", extra);
    CHECK(calibrated_policy_bytes(dir.path(), 16, fixture, "100k", extra) == one);
  }
}
