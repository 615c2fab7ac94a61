"""A plain vLLM engine beside an installed vllm_rl runs vLLM's own code.

vLLM loads every installed general plugin in each process it starts, vllm_rl's among
them (``vllm_rl.plugin``).  In a process that did not ask for the RL engine (no
``VLLM_RL_ENGINE=1``), a stock ``vllm.LLM`` built after ``import vllm_rl`` keeps every
attribute the patches target exactly as vLLM defines it, and no patch is applied.
"""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.engine

SCRIPT = r"""
import importlib, json, os
from conftest import MAX_MODEL_LEN

MISSING = object()


def entry(path):
    # The raw entry a dotted path names (a class's own __dict__ or a module global):
    # what a patch replaces or adds.
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:-1]:
            obj = getattr(obj, name)
        return vars(obj).get(parts[-1], MISSING)
    raise ImportError(path)


from vllm_rl.patches import all_patches, applied       # imports vLLM's patched modules
targets = sorted({t for p in all_patches() for t in p.targets})
before = {t: entry(t) for t in targets}

import vllm
import vllm_rl                                         # noqa: F401
from vllm_rl.llm import CPU_KV_CACHE_BYTES
from vllm_rl.task import MODEL_PATH

llm = vllm.LLM(str(MODEL_PATH), seed=0, max_model_len=MAX_MODEL_LEN,
               kv_cache_memory_bytes=CPU_KV_CACHE_BYTES)
out = llm.generate(["1 + 1 ="], vllm.SamplingParams(max_tokens=4), use_tqdm=False)
core = llm.llm_engine.engine_core.engine_core          # in process: the engine core itself
print("RESULT " + json.dumps({
    "targets": len(targets),
    "changed": [t for t in targets if entry(t) is not before[t]],
    "applied": [p.name() for p in all_patches() if applied(p)],
    "scheduler": type(core.scheduler).__module__,
    "tokens": len(out[0].outputs[0].token_ids),
}))
"""


def test_stock_engine_beside_vllm_rl_runs_vllms_own_code(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "VLLM_RL_ENGINE"}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"     # engine core and worker in this process
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(__file__)),
                                         env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["targets"] >= 13 and result["tokens"] > 0
    assert result["changed"] == [] and result["applied"] == []
    assert result["scheduler"].startswith("vllm.")
