// Same policy bytes on every x86-64 CPU (issue 53): MKL, ATen and oneDNN each pick a code path
// per CPU (MKL_CBWR=AUTO is AVX512_E1 on an AVX-512 Xeon, AVX2 on a Haswell; ATen runs its avx512
// or avx2 kernels), and two paths give other last bits, which reach a policy's distortions. A
// second CPU cannot be had in a test, so these force the paths another CPU would take through the
// libraries' own variables (MKL_CBWR, ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA): libheadwise pins
// one set when it loads (core/reproducible_math.hpp), whatever the environment asks for.
#include <dlfcn.h>
#include <catch2/catch.hpp>

#include <ATen/Version.h>

#include <cstdlib>
#include <string>

#include "../support/skip.hpp"
#include "../support/temp_dir.hpp"
#include "headwise/core/files.hpp"
#include "headwise/core/reproducible_math.hpp"

using namespace headwise;
using namespace headwise::testing;

namespace {

// This process pinned its own variables when libheadwise loaded; a child inherits them unless
// the run's environment names each one.
constexpr const char* kUnpinned = "-u MKL_CBWR -u ATEN_CPU_CAPABILITY -u ONEDNN_MAX_CPU_ISA";

// A small calibration of qwen3_next_tiny (MKL GEMMs, ATen's softmax and reductions, oneDNN's
// depthwise convolution in the DeltaNet layers) under `env`, at one thread: the policy's bytes.
// The budget binds (full KV is 256 KiB), so the windows come from the measured distortions.
std::string policy_bytes(const TempDir& dir, const std::string& name, const std::string& env) {
  const auto out = dir / (name + ".yaml");
  const auto fixture = std::filesystem::path(HEADWISE_FIXTURES_DIR) / "qwen3_next_tiny";
  const CliRun run = run_cli_with("--model " + fixture.string() +
                                      " --context 512 --windows 8,32,full --seq-len 96"
                                      " --samples 2 --budget 200k -q -o " +
                                      out.string(),
                                  std::string(kUnpinned) + " OMP_NUM_THREADS=1 " + env);
  INFO(env << "\n" << run.err);
  REQUIRE(run.status == 0);
  return read_text_file(out);
}

}  // namespace

TEST_CASE("libheadwise pins MKL's branch and ATen's kernels in its own process", "[core]") {
  if (!strict_cpu_math_requested()) HEADWISE_SKIP("HEADWISE_MKL_STRICT=0: nothing is pinned");
  CHECK(std::string(std::getenv("MKL_CBWR")) == pinned_mkl_branch());
  // MKL's own view of the branch it runs (mkl_serv_cbwr_get(MKL_CBWR_ALL): branch | STRICT;
  // AVX2 is 10, COMPATIBLE 3, STRICT 0x10000). Internal to MKL; skipped where it is not exported.
  using CbwrGet = int (*)(int);
  if (const auto get = reinterpret_cast<CbwrGet>(::dlsym(RTLD_DEFAULT, "mkl_serv_cbwr_get"))) {
    const int expected = std::string(pinned_mkl_branch()) == "AVX2,STRICT" ? 0x1000a : 0x10003;
    CHECK(get(-1) == expected);
  }
  // ATen reads ATEN_CPU_CAPABILITY once, on its first kernel dispatch: the pin must come first.
  if (cpu_has_avx2_fma()) CHECK(at::get_cpu_capability() == "AVX2");
}

TEST_CASE("HEADWISE_MKL_BRANCH=COMPATIBLE pins MKL's SSE2 branch and anything else AVX2",
          "[core]") {
  const char* saved = std::getenv("HEADWISE_MKL_BRANCH");
  const std::string before = saved ? saved : "";
  ::setenv("HEADWISE_MKL_BRANCH", "COMPATIBLE", 1);
  CHECK(std::string(pinned_mkl_branch()) == "COMPATIBLE,STRICT");
  ::setenv("HEADWISE_MKL_BRANCH", "AVX512", 1);
  CHECK(std::string(pinned_mkl_branch()) == "AVX2,STRICT");
  ::unsetenv("HEADWISE_MKL_BRANCH");
  CHECK(std::string(pinned_mkl_branch()) == "AVX2,STRICT");
  if (saved) ::setenv("HEADWISE_MKL_BRANCH", before.c_str(), 1);
}

TEST_CASE(
    "a calibration writes the same policy bytes whichever MKL branch and ATen kernels "
    "the environment asks for",
    "[stress]") {
  if (!cpu_has_avx2_fma()) HEADWISE_SKIP("the CPU has no AVX2/FMA: ATen's avx2 kernels cannot run");
  TempDir dir("cpu-branch");
  // The paths of two CPUs: a Haswell-class one (MKL's AVX2 branch, ATen's avx2 kernels) and an
  // older one (MKL's SSE4.2 branch, ATen's plain C++ kernels, oneDNN without AVX2), and this
  // CPU's own choice (MKL's AUTO branch: AVX512_E1 on an AVX-512 Xeon, where it differed).
  const std::string avx2 = "MKL_CBWR=AVX2,STRICT ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2";
  const std::string older =
      "MKL_CBWR=SSE4_2,STRICT ATEN_CPU_CAPABILITY=default "
      "ONEDNN_MAX_CPU_ISA=SSE41";
  const std::string own = "MKL_CBWR=AUTO,STRICT";

  // Before the pin (HEADWISE_MKL_STRICT=0 leaves the variables to the environment): the two
  // CPUs' paths give other bytes, so this test can see what it guards against.
  const std::string before_avx2 = policy_bytes(dir, "before-avx2", "HEADWISE_MKL_STRICT=0 " + avx2);
  CHECK(policy_bytes(dir, "before-older", "HEADWISE_MKL_STRICT=0 " + older) != before_avx2);
  // MKL's branch alone: differs where AUTO is not AVX2 (measured on the AVX-512 Xeon: it does).
  if (policy_bytes(dir, "before-own", "HEADWISE_MKL_STRICT=0 " + own) ==
      policy_bytes(dir, "before-mkl-avx2", "HEADWISE_MKL_STRICT=0 MKL_CBWR=AVX2,STRICT"))
    WARN("MKL's AUTO branch gives the AVX2 branch's policy on this CPU");

  // With the pin (the default): one policy, the AVX2 paths' bytes, whatever is asked for.
  const std::string pinned = policy_bytes(dir, "pinned", "");
  CHECK(pinned == before_avx2);
  CHECK(policy_bytes(dir, "pinned-older", older) == pinned);
  CHECK(policy_bytes(dir, "pinned-own", own + " ATEN_CPU_CAPABILITY=avx512") == pinned);
}
