"""ctest starts the peer tests with the system python; each peer (vLLM, kvpress) lives in a virtual
environment of its own (tools/setup.sh --vllm / --kvpress), named by the test's `--venv DIR`."""
import os
import pathlib
import sys


def reexec_in_venv():
    """Re-runs this process under DIR/bin/python when `--venv DIR` names one and this is not it."""
    if "--venv" not in sys.argv:
        return
    venv = pathlib.Path(sys.argv[sys.argv.index("--venv") + 1]).resolve()
    python = venv / "bin" / "python"
    if pathlib.Path(sys.prefix).resolve() != venv and python.exists():
        os.execv(str(python), [str(python), *sys.argv])
