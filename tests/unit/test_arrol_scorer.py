"""ARRoL's scorer on the worker without an engine: the fused trace reduction, the hidden
store, the verdicts of a step against a log-softmax reference, and that the step path adds
no host–device synchronisation (a tensor subclass marks every device tensor; any read of
one on the host is recorded) and reads its results only after vLLM's sync point.

The step is driven through hand-built runner / scheduler-output objects shaped like
vLLM 0.32's (``input_batch``, ``query_start_loc``, ``scheduled_new_reqs``, …); the real
engine path is ``tests/engine/test_arrol_engine.py``.
"""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_rl import rl_params, step_output
from vllm_rl.arrol import scorer as scorer_mod
from vllm_rl.arrol.config import ArrolConfig
from vllm_rl.arrol.head import QualityHead
from vllm_rl.arrol.hidden import HiddenStore
from vllm_rl.arrol.rule import ArrolVerdict
from vllm_rl.arrol.transfer import Transfer
from vllm_rl.kernels import logsumexp_entropy, torch_logsumexp_entropy

ROOT = Path(__file__).resolve().parents[2]
# the scorer and the parts it runs each step with
SCORER_PY = [ROOT / "vllm_rl" / "arrol" / f"{m}.py"
             for m in ("scorer", "transfer", "trace_sums", "step_plan", "served_head")]
TRACE_PY = ROOT / "kernels" / "trace_stats.py"


def _reference(x: torch.Tensor):
    lp = torch.log_softmax(x.float(), -1)
    return torch.logsumexp(x.float(), -1), -(lp.exp() * lp).nan_to_num().sum(-1)


# ---------------------------------------------------------------- fused reduction
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_logsumexp_entropy_equals_the_log_softmax_values(dtype):
    torch.manual_seed(0)
    x = (torch.randn(11, 997) * 5).to(dtype)
    x[3, :400] = float("-inf")                 # masked tokens: p = 0, no entropy
    x[4, 7] = 80.0                             # one dominant token: entropy near 0
    rows = torch.tensor([10, 3, 3, 0, 4])      # duplicates, any order
    lse, ent = logsumexp_entropy(x, rows)
    ref_lse, ref_ent = _reference(x[rows])
    assert lse.dtype == ent.dtype == torch.float32 and lse.shape == (5,)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    all_lse, all_ent = logsumexp_entropy(x)
    torch.testing.assert_close(all_ent, _reference(x)[1], atol=1e-5, rtol=1e-5)
    # chunked rows (bounded temporaries) give the same
    lse2, ent2 = torch_logsumexp_entropy(x, rows, chunk_elements=997 * 2)
    torch.testing.assert_close((lse2, ent2), (lse, ent))


def test_logsumexp_entropy_checks_and_empty_rows():
    lse, ent = logsumexp_entropy(torch.randn(3, 5), torch.zeros(0, dtype=torch.int64))
    assert lse.shape == ent.shape == (0,)
    with pytest.raises(ValueError, match="rows"):
        logsumexp_entropy(torch.randn(3, 5), torch.tensor([0.0]))
    with pytest.raises(ValueError, match="logits"):
        logsumexp_entropy(torch.randn(5))
    with pytest.raises(ValueError, match="backend"):
        logsumexp_entropy(torch.randn(3, 5), backend="cuda")


TRITON_CHECK = r"""
import importlib.util, json, sys, torch
spec = importlib.util.spec_from_file_location("trace_stats", sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
torch.manual_seed(0)
worst = 0.0
for V in (5, 1000, 3001):
    for dt in (torch.float32, torch.bfloat16):
        x = (torch.randn(7, V) * 4).to(dt)
        x[1, : V // 2] = float("-inf")
        wide = torch.randn(7, V + 9).to(dt)[:, 3:3 + V]        # row stride V + 9
        for src in (x, wide):
            for rows in (None, torch.tensor([6, 1, 1, 0]), torch.tensor([2], dtype=torch.int32)):
                a = m.triton_logsumexp_entropy(src, rows, block_v=256)
                b = m.torch_logsumexp_entropy(src, rows)
                worst = max(worst, max((p - q).abs().max().item() for p, q in zip(a, b)))
print(json.dumps({"worst": worst}))
"""


def test_triton_logsumexp_entropy_matches_pytorch_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", TRITON_CHECK, str(TRACE_PY)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["worst"] < 1e-5, out


# ---------------------------------------------------------------- hidden store
def test_hidden_store_takes_once_and_drops_the_oldest_past_capacity():
    store = HiddenStore(capacity=3)
    for k in range(5):
        store.put(f"r{k}", np.full(4, k, dtype=np.float32))
    assert len(store) == 3 and store.dropped == 2 and "r0" not in store
    got = store.take(["r4", "r0", "r2"])
    assert set(got) == {"r4", "r2"} and got["r4"].dtype == np.float32
    np.testing.assert_array_equal(got["r2"], np.full(4, 2.0))
    assert store.take(["r4"]) == {} and len(store) == 1
    store.put("t", torch.arange(3, dtype=torch.bfloat16))        # a host tensor converts
    assert store.take("t")["t"].tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(ValueError):
        HiddenStore(capacity=0)


def test_hidden_store_put_and_take_from_two_threads():
    store = HiddenStore(capacity=100_000)
    ids = [f"r{k}" for k in range(2000)]

    def put():
        for rid in ids:
            store.put(rid, np.zeros(2, dtype=np.float32))

    taken = {}
    done = threading.Event()
    t = threading.Thread(target=lambda: (put(), done.set()))
    t.start()
    while not done.is_set():            # take while the other thread puts
        taken.update(store.take(ids))
    t.join()
    taken.update(store.take(ids))
    assert set(taken) == set(ids) and store.dropped == 0


def test_verdict_layout_is_the_interface():
    assert ArrolVerdict._fields == ("score", "q", "p", "pruned", "version", "hidden", "trace",
                                   "auc")


# ---------------------------------------------------------------- a step on fake objects
H, V, PROMPT = 32, 257, 6


class Engine:
    """A batch that decodes one token per step; requests join with their last prompt
    token and are dropped after ``life`` steps (vLLM's finished_req_ids)."""

    def __init__(self, flags: dict, life: int = 14, dtype=torch.float32, seed: int = 0):
        self.flags, self.life, self.dtype = flags, life, dtype
        self.requests, self.alive, self.birth = {}, [], {}
        self.g = torch.Generator().manual_seed(seed)
        self.count = 0

    def step(self, step: int, join: int):
        new = []
        for _ in range(join):
            rid = f"r{self.count}"
            self.count += 1
            self.requests[rid] = SimpleNamespace(
                sampling_params=SimpleNamespace(seed=self.count, extra_args=rl_params(
                    arrol=self.flags(self.count) if callable(self.flags) else self.flags)),
                prompt_token_ids=list(range(PROMPT)))
            self.alive.append(rid)
            self.birth[rid] = step
            new.append(rid)
        done = {r for r in self.alive if step - self.birth[r] >= self.life}
        self.alive = [r for r in self.alive if r not in done]
        for r in done:
            del self.requests[r]
        n = len(self.alive)
        batch = SimpleNamespace(
            num_reqs=n, req_ids=list(self.alive),
            req_id_to_index={r: i for i, r in enumerate(self.alive)},
            num_prompt_tokens=np.full(n, PROMPT, dtype=np.int32),
            num_computed_tokens_cpu=np.array([PROMPT - 1 + step - self.birth[r]
                                              for r in self.alive], dtype=np.int32))
        runner = SimpleNamespace(requests=self.requests, input_batch=batch,
                                 query_start_loc=SimpleNamespace(
                                     np=np.arange(n + 1, dtype=np.int32)))
        so = SimpleNamespace(num_scheduled_tokens={r: 1 for r in self.alive},
                             scheduled_spec_decode_tokens={}, finished_req_ids=done,
                             scheduled_new_reqs=[SimpleNamespace(req_id=r) for r in new])
        state = SimpleNamespace(scheduler_output=so, spec_decode_metadata=None,
                                logits=(torch.randn(n, V, generator=self.g) * 3).to(self.dtype),
                                hidden_states=torch.randn(n, H, generator=self.g))
        tokens = torch.randint(0, V, (n,), generator=self.g).tolist()
        return runner, state, tokens


def _head_state():
    torch.manual_seed(1)
    return QualityHead(H, width=8, inputs="both").export(4)


def _calibration():
    return {"pos": [3] * 64 + [1] * 64, "neg": [1] * 64 + [3] * 64, "alpha": 1.0,
            "prior": 0.5, "delta": 0.0}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_steps_verdicts_against_log_softmax_and_the_head(dtype):
    """Trace features over the first l_detect tokens (mean / min log-probability, mean
    entropy of the raw logits, as a log-softmax computes them), the head's score on the
    hidden row at l_detect with those features, Eq. 1-2 and the coin; the hidden state
    stays in the store (``hidden`` True) and equals the row."""
    state = _head_state()
    scorer = scorer_mod.HeadScorer(ArrolConfig(head=state, calibration=_calibration()),
                                   H, torch.device("cpu"))
    eng = Engine(lambda c: {"l_detect": 3 + c % 4, "return_hidden": c % 2 == 0}, dtype=dtype)
    seen: dict[str, list] = {}          # rid -> [(logprob, entropy)] of its tokens
    verdicts, hidden_ref = {}, {}
    for step in range(30):
        runner, st, tokens = eng.step(step, join=5 if step < 15 else 0)
        for i, rid in enumerate(runner.input_batch.req_ids):
            L = eng.requests[rid].sampling_params.extra_args["vllm_rl"]["arrol"]["l_detect"]
            gen = int(runner.input_batch.num_computed_tokens_cpu[i]) - PROMPT + 1
            if gen == L:
                hidden_ref[rid] = st.hidden_states[i].clone()
            lp = torch.log_softmax(st.logits[i].float(), -1)
            seen.setdefault(rid, []).append((lp[tokens[i]].item(),
                                             -(lp.exp() * lp).sum().item()))
        plan = scorer.plan(runner, st)
        if st.logits.dtype == torch.float32:
            st.logits.div_(0.7)                      # the sampler's temperature, in place
        out = SimpleNamespace(sampled_token_ids=[[t] for t in tokens],
                              req_id_to_index=runner.input_batch.req_id_to_index)
        if plan:
            scorer.finish(plan, out)
        verdicts.update(_verdicts(out))
    assert len(verdicts) == eng.count == 75
    for rid, v in verdicts.items():
        L = 3 + (int(rid[1:]) + 1) % 4          # request r{k} got the flags of count k + 1
        terms = seen[rid][:L]
        lps = [a for a, _ in terms]
        trace = (sum(lps) / L, min(lps), sum(b for _, b in terms) / L)
        assert v.trace == pytest.approx(trace, abs=2e-5)
        assert isinstance(v.hidden, bool) and v.hidden == ((int(rid[1:]) + 1) % 2 == 0)
        assert v.version == 4 and v.q is not None and v.p is not None
    kept = [rid for rid, v in verdicts.items() if v.hidden]
    got = scorer.take_hidden(kept + ["nobody"])
    assert set(got) == set(kept)
    for rid in kept:
        assert got[rid].dtype == np.float32
        np.testing.assert_allclose(got[rid], hidden_ref[rid].numpy(), rtol=0, atol=0)
    # the scores are the head's on those rows and features
    qh = QualityHead(H, width=8, inputs="both")
    qh.fc1.weight.data = torch.tensor(state["w1"])
    qh.fc1.bias.data = torch.tensor(state["b1"])
    qh.fcf.weight.data = torch.tensor(state["w1f"])
    qh.fc2.weight.data = torch.tensor([state["w2"]])
    qh.fc2.bias.data = torch.tensor([state["b2"]])
    ids = sorted(hidden_ref)
    expect = qh.score(torch.stack([hidden_ref[r] for r in ids]),
                      torch.tensor([verdicts[r].trace for r in ids]))
    torch.testing.assert_close(torch.tensor([verdicts[r].score for r in ids]), expect,
                               atol=1e-5, rtol=0)
    assert scorer.info()["scored"] == 75 and scorer.info()["hidden_kept"] == 0
    assert not scorer._reqs                      # every sample scored or gone


# ---------------------------------------------------------------- no added sync
HOST_READS = {"tolist", "item", "numpy", "cpu", "__bool__", "__int__", "__float__",
              "__index__", "__array__", "__len__"}


class Guard:
    def __init__(self):
        self.phase = "idle"
        self.reads: list[tuple[str, str]] = []
        self.events: list[tuple[str, str]] = []


GUARD = Guard()


class Dev(torch.Tensor):
    """A tensor that lives on 'the device': reading its values on the host is recorded."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name in HOST_READS or (name == "to" and _to_host(args, kwargs)):
            GUARD.reads.append((GUARD.phase, name))
        return super().__torch_function__(func, types, args, kwargs)


def _to_host(args, kwargs) -> bool:
    """``.to("cpu")`` without ``non_blocking`` (here every tensor is on the CPU, so a
    ``torch.device`` taken from a tensor means "its device": only the string names the
    host)."""
    target = [a for a in args[1:] if isinstance(a, str)]
    target += [kwargs["device"]] if isinstance(kwargs.get("device"), str) else []
    return any(t.startswith("cpu") for t in target) and not kwargs.get("non_blocking")


class FakeTransfer(Transfer):
    """The CUDA path's shape on the CPU: up() gives device tensors, down() a host copy."""

    def __init__(self):
        super().__init__("cpu")
        self.cuda = True

    def up(self, *parts):
        GUARD.events.append((GUARD.phase, "up"))
        return [t.as_subclass(Dev) for t in Transfer("cpu").up(*parts)]

    def down(self, t):
        GUARD.events.append((GUARD.phase, "down"))
        return t.as_subclass(torch.Tensor).clone()

    def ready(self):
        GUARD.events.append((GUARD.phase, "ready"))
        return "event"

    def wait(self, event):
        GUARD.events.append((GUARD.phase, "wait"))


def _device_scorer(monkeypatch):
    scorer = scorer_mod.HeadScorer(ArrolConfig(head=_head_state(), calibration=_calibration()),
                                   H, torch.device("cpu"))
    scorer.xfer = FakeTransfer()
    h = scorer.head
    scorer.head = replace(h, **{k: getattr(h, k).as_subclass(Dev)
                                           for k in ("w1", "b1", "w2", "b2", "w1f")})
    from vllm_rl.kernels import trace_stats

    fused = trace_stats.logsumexp_entropy                    # its outputs: device tensors
    monkeypatch.setattr(trace_stats, "logsumexp_entropy", lambda *a, **k: tuple(
        t.as_subclass(Dev) for t in fused(*a, **k)))
    sums = scorer.sums
    sums.take(1)                                             # grow once, then mark
    sums.acc = sums.acc.as_subclass(Dev)
    sums.give_back(sums.resets.pop())
    return scorer


def _verdicts(out) -> dict:
    step = step_output.of(out)
    return {} if step is None else step.verdicts


class AsyncOut:
    """vLLM's AsyncGPUModelRunnerOutput's shape: get_output waits for its copy event (and,
    as the ``get_output`` patch adds, settles the decisions deferred to it)."""

    def __init__(self, mro, sampled: torch.Tensor):
        self._model_runner_output = mro
        self._sampled_token_ids = sampled
        self._invalid_req_indices = []

    def get_output(self):
        GUARD.phase = "vllm synchronised (get_output)"
        self._model_runner_output.sampled_token_ids = [
            [t] for t in self._sampled_token_ids.as_subclass(torch.Tensor)[:, 0].tolist()]
        step_output.settle(self._model_runner_output)
        return self._model_runner_output


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_step_path_reads_no_device_value_before_vllms_sync(monkeypatch, mode):
    """plan (before sampling) and finish (after) never read a device tensor on the host;
    results come down only through non-blocking copies started in plan; they are read
    (and the step's event waited on) only after vLLM's own sync point: after its
    ``_to_list`` (sync output) or inside ``get_output`` (async output)."""
    GUARD.__init__()
    scorer = _device_scorer(monkeypatch)
    eng = Engine(lambda c: {"l_detect": 3 + c % 3, "return_hidden": c % 2 == 0})
    verdicts = {}
    for step in range(16):
        runner, st, tokens = eng.step(step, join=4 if step < 8 else 0)
        st.logits = st.logits.as_subclass(Dev)
        st.hidden_states = st.hidden_states.as_subclass(Dev)
        GUARD.phase = "plan"
        plan = scorer.plan(runner, st)
        mro = SimpleNamespace(req_id_to_index=runner.input_batch.req_id_to_index,
                              sampled_token_ids=[])
        if mode == "sync":
            GUARD.phase = "vllm synchronised (_to_list)"
            mro.sampled_token_ids = [[t] for t in tokens]
            out = mro
        else:
            GUARD.phase = "vllm sampled (async: no sync yet)"
            out = AsyncOut(mro, torch.tensor(tokens).unsqueeze(1).as_subclass(Dev))
        if plan:
            GUARD.phase = "finish"
            scorer.finish(plan, out)
        if mode == "async":
            GUARD.phase = "async output thread"
            out = out.get_output()
        verdicts.update(_verdicts(out))
        GUARD.phase = "idle"
    assert len(verdicts) == 32
    assert GUARD.reads == [], GUARD.reads[:10]
    downs = {p for p, e in GUARD.events if e in ("down", "ready")}
    waits = {p for p, e in GUARD.events if e == "wait"}
    assert downs == {"plan"}
    assert waits == ({"finish"} if mode == "sync" else {"vllm synchronised (get_output)"})
    if mode == "async":           # finish waited for nothing and decided nothing
        assert ("finish", "wait") not in GUARD.events
    assert all(isinstance(v.hidden, bool) for v in verdicts.values())
    assert len(scorer.take_hidden(list(verdicts))) == 16


# ---------------------------------------------------------------- structural check
ALLOWED_HOST_READS = {"_decide", "wait", "add_sampled", "_plan", "add_sampled_async",
                      "up", "_admit"}


def test_scorer_source_has_no_blocking_transfer():
    """No ``torch.tensor(..., device=...)`` (a blocking copy from pageable memory), every
    ``.to("cpu")`` non-blocking, ``synchronize`` only in Transfer.wait, and
    ``tolist()`` / ``item()`` / ``numpy()`` / ``cpu()`` only where they read host data
    (numpy index arrays, the pinned results after the sync point)."""
    where: dict[str, list[str]] = {}
    for fn in (n for f in SCORER_PY for n in ast.walk(ast.parse(f.read_text()))):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            kw = {k.arg: k.value for k in node.keywords}
            if name == "tensor" and "device" in kw:
                where.setdefault("tensor(device=)", []).append(fn.name)
            if name == "to" and node.args and isinstance(node.args[0], ast.Constant) \
                    and node.args[0].value == "cpu":
                nb = kw.get("non_blocking")
                if not (isinstance(nb, ast.Constant) and nb.value is True):
                    where.setdefault("to(cpu) blocking", []).append(fn.name)
            if name in ("synchronize", "tolist", "item", "numpy", "cpu"):
                where.setdefault(name, []).append(fn.name)
    assert "tensor(device=)" not in where and "to(cpu) blocking" not in where, where
    assert set(where.get("synchronize", [])) == {"wait"}, where
    assert "cpu" not in where and "item" not in where, where
    # tolist / numpy: host numpy arrays (plan, finish) and the pinned results (_decide)
    assert set(where.get("tolist", [])) <= ALLOWED_HOST_READS, where
    assert set(where.get("numpy", [])) <= {"_decide"}, where
