"""With no RL flags the RL engine is stock vLLM: the same tokens for the same seeds."""
import pytest
import vllm
from vllm import SamplingParams

from conftest import MAX_MODEL_LEN, shutdown
from vllm_rl.llm import CPU_KV_CACHE_BYTES
from vllm_rl.task import MODEL_PATH

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def stock_llm():
    llm = vllm.LLM(str(MODEL_PATH), seed=0, max_model_len=MAX_MODEL_LEN, async_scheduling=True,
                   kv_cache_memory_bytes=CPU_KV_CACHE_BYTES)
    yield llm
    shutdown(llm)


def test_same_tokens_as_stock_vllm(rl_llm, stock_llm, prompts):
    sp = SamplingParams(n=4, temperature=1.0, max_tokens=128, seed=11, logprobs=0)
    ours = rl_llm.generate(prompts[:16], sp, use_tqdm=False)
    stock = stock_llm.generate(prompts[:16], sp, use_tqdm=False)
    for a, b in zip(ours, stock):
        assert [list(c.token_ids) for c in a.outputs] == [list(c.token_ids) for c in b.outputs]
        assert [c.finish_reason for c in a.outputs] == [c.finish_reason for c in b.outputs]
        assert [c.stop_reason for c in a.outputs] == [c.stop_reason for c in b.outputs]


def test_stock_engine_is_stock(stock_llm):
    cfg = stock_llm.llm_engine.vllm_config.scheduler_config
    assert cfg.scheduler_cls is None or "vllm_rl" not in str(cfg.scheduler_cls)
