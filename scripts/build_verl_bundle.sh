#!/bin/bash
# Build the verl bundle for the lent GPU machine (run on the x86-64 development machine; PyPI only), for
# benchmarks/vs_verl_gpu.py. Like ../shared/device/build.sh: wheels for CPython 3.12 / manylinux x86-64,
# installed with --no-deps --target, packed with xz.
#   bash scripts/build_verl_bundle.sh [OUT_DIR]      default OUT_DIR: .dev/verl (ignored by git)
# Writes OUT_DIR/verl-site.tar.xz (top folder sitev/, unpacked into /tmp/site by scripts/vs_verl_gpu.sh) and
# OUT_DIR/VERSIONS (the pins below), and the liger-kernel and python-multipart wheels.
#
# Versions: verl 0.9.1 is the newest on PyPI; its [sglang] extra pins sglang 0.5.12 and transformers 5.9.0 (core:
# transformers<5.11), torch 2.11.0. The GPU machine runs torch 2.11.0+cu130 and our SGLang bundle sglang 0.5.16 with
# transformers 5.12.1: installed --no-deps, verl runs against those (its SGLang server adapter branches on the
# SGLang version and takes the >= 0.5.10 path). Only what the machine and our two bundles lack is added: the
# machine has accelerate, peft, pandas, pyarrow, numpy, tensorboard, aiohttp, xxhash, fsspec, huggingface-hub;
# the SGLang bundle has dill, orjson, msgspec, pyzmq, fastapi, uvicorn; the base bundle ray, hydra-core, omegaconf.
# verl starts SGLang as an HTTP server (sglang.srt.entrypoints.http_server; our bundle only ran its Engine), which
# needs soundfile (imported at module level) and python-multipart (FastAPI's form routes), carried as a wheel.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUTD="$(mkdir -p "${1:-$ROOT/.dev/verl}" && cd "${1:-$ROOT/.dev/verl}" && pwd)"
W="${WORK:-$(mktemp -d /tmp/roll-verl-bundle.XXXXXX)}"
PY="${PYTHON:-python3}"
echo "work dir: $W   output: $OUTD"
mkdir -p "$W/dl"

TGT=(--python-version 3.12 --implementation cp)
for p in manylinux_2_34 manylinux_2_28 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
    TGT+=(--platform "${p}_x86_64")
done
PINS=(verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0 importlib_metadata==10.2.0 torchdata==0.11.0
      codetiming==1.4.0 datasets==4.4.1 multiprocess==0.70.18 cachetools==8.0.2
      soundfile==0.14.0 cffi==2.1.1 pycparser==3.12)  # SGLang's HTTP server imports soundfile
SDIST=(pylatexenc==2.10)   # source-only on PyPI: built into a py3-none-any wheel

"$PY" -m pip download -q --no-deps --only-binary=:all: "${TGT[@]}" -d "$W/dl" "${PINS[@]}"
"$PY" -m pip wheel -q --no-deps -w "$W/dl" "${SDIST[@]}"
rm -rf "$W/sitev"
"$PY" -m pip install -q --no-deps --no-compile --no-cache-dir --only-binary=:all: --ignore-requires-python \
    "${TGT[@]}" --target "$W/sitev" "$W"/dl/*.whl
# verl's wheel carries its tests' fixtures, recipes' docs and vendored NPU/MindSpeed/veOmni/torchtitan glue that a
# CUDA FSDP + SGLang run never imports; dropping them keeps the bundle small. __pycache__ is rebuilt there.
rm -rf "$W/sitev/bin" "$W/sitev/verl/experimental/transfer_queue/"*.md
find "$W/sitev" -name __pycache__ -type d -prune -exec rm -rf {} +
du -sh "$W/sitev"
printf '%s\n' "${PINS[@]}" "${SDIST[@]}" > "$OUTD/VERSIONS"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime='2026-01-01 00:00:00' -cf - -C "$W" sitev \
    | xz -9 -T0 > "$OUTD/verl-site.tar.xz.tmp" && mv "$OUTD/verl-site.tar.xz.tmp" "$OUTD/verl-site.tar.xz"
echo "$OUTD/verl-site.tar.xz: $(stat -c %s "$OUTD/verl-site.tar.xz") bytes"
# liger-kernel (pure Python + Triton; both sides use Liger's kernels) and python-multipart, as wheels that
# scripts/vs_verl_gpu.sh unpacks into /tmp/site.
"$PY" -m pip download -q --no-deps -d "$OUTD" liger-kernel==0.8.5 python-multipart==0.0.34
ls -la "$OUTD"
