#!/usr/bin/env bash
# Run HERE, where apt works (Debian 12, x86-64): downloads the Debian packages headwise builds
# against into .gpu-debs/ (git-ignored), so tools/gpu-check.sh can build on the GPU machine,
# which has torch, nvcc, cmake and ninja but no network and maybe not these headers.
# The device tool carries the folder: run(carry=[".gpu-debs"], command="tools/gpu-check.sh").
# The packages are unpacked into a private prefix there (never into /), see gpu-check.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/.gpu-debs
mkdir -p "$out"
# Build dependencies (versions.env's DEBIAN_PACKAGES) with their runtime libraries, plus
# pkg-config itself (CMake's pkg_check_modules needs it for PCRE2 and ICU).
packages=(
  libyaml-cpp-dev libyaml-cpp0.7 libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libcli11-dev
  nlohmann-json3-dev catch2 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libicu-dev libicu72 libssl-dev libssl3 pkgconf pkgconf-bin libpkgconf3
)
apt_opts=(-oAPT::Architecture=amd64)
if ! (cd "$out" && apt-get "${apt_opts[@]}" download "${packages[@]}" >/dev/null); then
  apt-get "${apt_opts[@]}" update >/dev/null
  (cd "$out" && apt-get "${apt_opts[@]}" download "${packages[@]}" >/dev/null)
fi
# Plain file names ("1%3a1.10.0" → "1_1.10.0"): the device tool carries only simple names.
for f in "$out"/*%3a*; do [[ -e $f ]] && mv "$f" "${f//%3a/_}"; done
du -sh "$out"
ls "$out"
