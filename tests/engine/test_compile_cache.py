"""An engine started a second time loads the compiled model the first one saved
(``patches/compilation.py``), and computes exactly what the fresh compile did."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine

SCRIPT = r"""
import json, os, sys
from vllm import SamplingParams
from vllm.compilation.counter import compilation_counter
from vllm_rl import LLM
from vllm_rl.task import MODEL_PATH, heldout_prompts

if __name__ == "__main__":
    llm = LLM(MODEL_PATH, seed=0, max_model_len=512)   # the suite's engines' length
    outs = llm.generate(heldout_prompts(2), SamplingParams(temperature=0, max_tokens=24,
                                                          logprobs=0), use_tqdm=False)
    print("RESULT " + json.dumps({
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "logprobs": [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids,
                                                      o.outputs[0].logprobs)] for o in outs],
        "loaded": compilation_counter.num_aot_artifacts_loaded,
        "compiled": compilation_counter.num_aot_compiles}), flush=True)
    os._exit(0)
"""


def _start(cache, tmp_path):
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):]), done.stderr


def _share_kernels(cache: Path) -> None:
    """The fresh root reads inductor's compiled kernels from the default root's (where
    the suite's engines of this configuration left them), not its saved models: the first
    start still compiles the model, without compiling its kernels again."""
    root = Path(os.environ.get("VLLM_CACHE_ROOT", "~/.cache/vllm")).expanduser()
    aot = "torch_compile_cache/torch_aot_compile"
    for kernels in (root / aot).glob("*/inductor_cache"):
        link = cache / aot / kernels.parent.name / "inductor_cache"
        link.parent.mkdir(parents=True)
        link.symlink_to(kernels, target_is_directory=True)


def test_an_engine_loads_the_model_its_predecessor_compiled(tmp_path):
    cache = tmp_path / "cache"
    _share_kernels(cache)
    first, _ = _start(cache, tmp_path)
    assert first["compiled"] == 1 and first["loaded"] == 0
    second, log = _start(cache, tmp_path)
    assert second["loaded"] == 1 and second["compiled"] == 0, log[-3000:]
    assert "Compiling model again" not in log
    assert second["tokens"] == first["tokens"] and len(first["tokens"][0]) > 0
    assert second["logprobs"] == first["logprobs"]
