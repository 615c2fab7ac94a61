"""Step-cost models (vllm_rl.cost): pure Python, no engine; one CPU run of the measurer."""
from __future__ import annotations

import itertools
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_rl.darts.rollout_budget import rollout_cost
from vllm_rl.cost import OnlineCost, Projection, StepCost, TableCost, load_cost, project
from vllm_rl.cost import base as cost_base
from vllm_rl.cost import online as cost_online

PACKAGED = cost_base.DATA_DIR / "step_cost_h100.json"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "gpu" / "step_cost_h100.json"
SHAPES = ("qwen3-8b", "qwen3-1.7b")


@pytest.fixture(scope="module")
def tables() -> dict[str, TableCost]:
    return {shape: TableCost.load("h100", shape) for shape in SHAPES}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return json.loads(PACKAGED.read_text())["rows"]


def nondecreasing(values, tol=1e-9) -> bool:
    return all(b >= a - tol for a, b in zip(values, values[1:]))


# ---------------------------------------------------------------------- the data file


# sha256 of shared/gpu/step_cost_h100.json as measured on 2026-11-22 (the CEO's table)
SHARED_SHA256 = "b4784995f73c91625b1c3c2e2763264115e2bc03ce84cbd98ae3f166ae925a3b"


def test_packaged_table_is_the_shared_one():
    import hashlib

    assert hashlib.sha256(PACKAGED.read_bytes()).hexdigest() == SHARED_SHA256
    if SHARED.exists():                 # beside the checkout (CI): still the same table
        assert PACKAGED.read_bytes() == SHARED.read_bytes()


def test_packaged_table_is_package_data():
    from importlib.resources import files

    assert (files("vllm_rl.cost") / "data" / "step_cost_h100.json").is_file()
    setup = Path(__file__).resolve().parents[2] / "setup.py"
    if setup.exists():
        assert '"vllm_rl.cost": ["data/*.json"]' in setup.read_text()


def test_model_imports_no_torch():
    code = ("import sys, vllm_rl.cost; "
            "assert 'torch' not in sys.modules and 'vllm' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------- TableCost


def test_grid_points_exact(tables):
    t8, t17 = tables["qwen3-8b"], tables["qwen3-1.7b"]
    assert t8.uniform_ms(16, 1, 256) == pytest.approx(7.2014, abs=1e-9)
    assert t8.uniform_ms(1024, 1, 256) == pytest.approx(43.43, abs=0.01)
    assert t8.uniform_ms(1024, 9, 256) == pytest.approx(262.8203, abs=1e-9)
    # the README's examples at 8B, L = 1024
    for B, q, ms in [(1, 1, 7.18), (16, 1, 7.82), (64, 1, 10.45), (256, 1, 21.83),
                     (16, 9, 8.92), (256, 9, 77.86)]:
        assert t8.uniform_ms(B, q, 1024) == pytest.approx(ms, abs=0.01)
    assert t17.uniform_ms(32, 1, 8192) == pytest.approx(12.3892, abs=1e-9)


def test_every_grid_point_is_measured_or_a_listed_adjustment(tables, rows):
    for shape, table in tables.items():
        adjusted = {(a.B, a.q, a.L): a for a in table.adjustments}
        for r in (r for r in rows if r["shape"] == shape):
            got = table.uniform_ms(r["B"], r["q"], r["L"])
            key = (r["B"], r["q"], r["L"])
            if key in adjusted:
                assert adjusted[key].measured == r["ms"] and adjusted[key].used == got
                assert r["ms"] < got < r["ms"] + 0.06          # noise-sized raise only
            else:
                assert got == pytest.approx(r["ms"], abs=1e-9)
    assert len(tables["qwen3-8b"].adjustments) == 10
    assert tables["qwen3-1.7b"].adjustments == []


def test_interpolation_between_neighbours(tables):
    t = tables["qwen3-8b"]
    # B = 8 is the log2 midpoint of 4 and 16; q = 4 the midpoint of 3 and 5;
    # L = 2048 the log2 midpoint of 1024 and 4096.
    assert t.uniform_ms(8, 1, 256) == pytest.approx(
        (t.uniform_ms(4, 1, 256) + t.uniform_ms(16, 1, 256)) / 2)
    assert t.uniform_ms(64, 4, 512) == pytest.approx(
        (t.uniform_ms(64, 3, 512) + t.uniform_ms(64, 5, 512)) / 2)
    assert t.uniform_ms(32, 2, 2048) == pytest.approx(
        (t.uniform_ms(32, 2, 1024) + t.uniform_ms(32, 2, 4096)) / 2)
    for (b0, b1), (q0, q1), (l0, l1) in itertools.product(
            [(16, 32), (64, 128)], [(1, 2), (5, 9)], [(256, 512), (512, 1024)]):
        b, q, L = math.sqrt(b0 * b1) * 1.1, (q0 + q1) / 2 + 0.3, math.sqrt(l0 * l1) * 0.9
        corners = [t.uniform_ms(*c) for c in itertools.product((b0, b1), (q0, q1), (l0, l1))]
        assert min(corners) <= t.uniform_ms(b, q, L) <= max(corners)


@pytest.mark.parametrize("shape", SHAPES)
def test_monotone_in_batch_width_and_context(tables, shape):
    t = tables[shape]
    Bs = [0.5, 1, 2, 3, 4, 6, 16, 24, 32, 48, 64, 100, 128, 200, 256, 384, 512, 768, 1024,
          1500, 2048]
    qs = [0.5, 1, 1.5, 2, 2.5, 3, 4, 5, 7, 9, 10, 16, 64]
    Ls = [0, 100, 256, 300, 512, 700, 1024, 2048, 4096, 6000, 8192, 10000, 16384]
    grid = {(B, q, L): t.uniform_ms(B, q, L) for B in Bs for q in qs for L in Ls}
    for q, L in itertools.product(qs, Ls):
        assert nondecreasing([grid[B, q, L] for B in Bs]), (q, L)
    for B, L in itertools.product(Bs, Ls):
        assert nondecreasing([grid[B, q, L] for q in qs]), (B, L)
    for B, q in itertools.product(Bs, qs):
        assert nondecreasing([grid[B, q, L] for L in Ls]), (B, q)
    assert all(v > 0 for v in grid.values())


@pytest.mark.parametrize("shape", SHAPES)
def test_width_curve_is_uniform_ms_at_each_width(tables, shape):
    """The batch caps' one call per step gives exactly :meth:`uniform_ms`'s values, in
    and past the grid, at batches asked for again (the per-batch cache) and fresh."""
    t = tables[shape]
    rng = random.Random(0)
    for _ in range(400):
        B = rng.choice([0, 0.5, 1, 3, 17, 100, 700, 1024, 3000, rng.uniform(0, 5000)])
        L = rng.choice([0, 100, 256, 300, 1024, 5000, 8192, 20000, rng.uniform(0, 3e4)])
        widths = [1 + k * rng.uniform(0, 3) for k in range(9)] + [0.3, 9, 12]
        for _ in range(2):
            assert t.width_curve(B, widths, L) == [t.uniform_ms(B, w, L) for w in widths]
    online = OnlineCost(prior=t)
    assert online.width_curve(64, [1, 2, 5], 300) == [t.uniform_ms(64, w, 300)
                                                      for w in (1, 2, 5)]


def test_extrapolation_in_batch_is_linear(tables):
    t = tables["qwen3-8b"]
    # L = 8192 was measured up to B = 32: past it, the slope of B = 16..32, per sequence.
    slope = (19.6456 - 13.3269) / 16
    ext = [t.uniform_ms(B, 1, 8192) for B in (32, 64, 128, 256, 512)]
    assert [b - a for a, b in zip(ext, ext[1:])] == pytest.approx(
        [slope * d for d in (32, 64, 128, 256)])
    # L = 256 was measured up to B = 1024.
    slope = (43.4282 - 22.2016) / 512
    assert t.uniform_ms(2048, 1, 256) == pytest.approx(43.4282 + 1024 * slope)
    assert t.uniform_ms(3072, 1, 256) - t.uniform_ms(2048, 1, 256) == pytest.approx(
        t.uniform_ms(2048, 1, 256) - t.uniform_ms(1024, 1, 256))
    assert t.uniform_ms(3000, 9, 256) > t.uniform_ms(3000, 5, 256) > t.uniform_ms(3000, 1, 256)


def test_extrapolation_in_width_and_context_is_linear(tables):
    t = tables["qwen3-8b"]
    slope = (8.9188 - 8.4201) / 4                       # q = 5 -> 9 at B = 16, L = 1024
    for q in (13, 17, 105):
        assert t.uniform_ms(16, q, 1024) == pytest.approx(8.9188 + (q - 9) * slope)
    prefill = [t.uniform_ms(1, q, 256) for q in (9, 64, 512, 2048)]
    assert all(b > a for a, b in zip(prefill, prefill[1:]))
    slope = (19.6456 - 13.3726) / 4096                  # L = 4096 -> 8192 at B = 32, q = 1
    for L in (10000, 16384, 32768):
        assert t.uniform_ms(32, 1, L) == pytest.approx(19.6456 + (L - 8192) * slope)


def test_clamps(tables):
    t = tables["qwen3-8b"]
    assert t.uniform_ms(0.3, 1, 256) == t.uniform_ms(1, 1, 256)
    assert t.uniform_ms(0) == 0.0
    assert t.uniform_ms(16, 1, 10) == t.uniform_ms(16, 1, 0) == t.uniform_ms(16, 1, 256)
    assert t.uniform_ms(16, 0.5, 512) == t.uniform_ms(16, 1, 512)
    for bad in [(-1, 1, 256), (4, -1, 256), (4, 1, -5), (math.nan, 1, 256), (4, 1, "x")]:
        with pytest.raises(ValueError):
            t.uniform_ms(*bad)


def test_mixed_step_maps_to_the_mean_step(tables):
    t = tables["qwen3-8b"]
    assert t.step_ms([], []) == 0.0
    assert t.step_ms([0, 0], [5, 7]) == 0.0
    assert t.step_ms([1, 1, 3, 3], [100, 300, 500, 700]) == pytest.approx(t.uniform_ms(4, 2, 400))
    assert t.step_ms([1, 0, 1], [300, 9999, 500]) == pytest.approx(t.uniform_ms(2, 1, 400))
    assert t.step_ms([1] * 64, [1024] * 64) == pytest.approx(10.4498)
    # a decode batch with one 2048-token prefill chunk: the mean width (~9) carries the tokens
    decode = t.step_ms([1] * 255, [2000] * 255)
    mixed = t.step_ms([1] * 255 + [2048], [2000] * 255 + [0])
    assert mixed == pytest.approx(t.uniform_ms(256, (255 + 2048) / 256, 255 * 2000 / 256))
    assert mixed > 2 * decode
    for widths, contexts in [([1, 2], [3]), ([-1], [3]), ([1], [-3]), ([1.5], [3])]:
        with pytest.raises(ValueError):
            t.step_ms(widths, contexts)


def test_ptl_and_verify_extra(tables):
    t = tables["qwen3-8b"]
    ptl = t.ptl()
    assert callable(ptl) and ptl(16) == pytest.approx(7.2014)
    assert t.ptl(context=1024)(64) == pytest.approx(10.4498)
    # usable as DARTS' PTL curve in Eq. 4
    assert rollout_cost([10, 20], ptl) == pytest.approx(10 * ptl(2) + 10 * ptl(1))
    assert t.verify_extra_ms(16, 9, 256) == pytest.approx(8.2811 - 7.2014)
    assert t.verify_extra_ms(16, 1, 256) == 0.0
    assert t.verify_extra_ms(256, 5, 1024) > t.verify_extra_ms(16, 5, 1024) > 0


def test_describe_and_to_dict(tables):
    t = tables["qwen3-1.7b"]
    assert "H100" in t.describe() and "qwen3-1.7b" in t.describe()
    d = json.loads(json.dumps(t.to_dict()))
    assert d["shape"] == "qwen3-1.7b" and d["grid"]["B"]["8192"] == [1, 4, 16, 32]
    assert t.name == "h100:qwen3-1.7b"


def test_ragged_table_validation(tmp_path):
    rows = [{"shape": "s", "B": B, "q": q, "L": 64, "ms": float(B + q)}
            for B in (1, 2) for q in (1, 2)]
    t = TableCost(rows, "s")
    assert t.uniform_ms(3, 1, 64) == pytest.approx(4.0)      # linear past B = 2
    with pytest.raises(ValueError, match="no row"):
        TableCost(rows[:-1], "s")
    with pytest.raises(ValueError, match="duplicate"):
        TableCost(rows + rows[:1], "s")
    with pytest.raises(ValueError, match="no rows"):
        TableCost(rows, "other")


# --------------------------------------------------------------------------- load_cost


def test_load_cost_specs(tmp_path, tables):
    path = tmp_path / "table.json"
    path.write_text(PACKAGED.read_text())
    single = tmp_path / "single.json"
    rows = json.loads(PACKAGED.read_text())["rows"]
    single.write_text(json.dumps({"rows": [r for r in rows if r["shape"] == "qwen3-1.7b"]}))
    ref8 = tables["qwen3-8b"].uniform_ms(64, 3, 700)
    ref17 = tables["qwen3-1.7b"].uniform_ms(64, 3, 700)
    assert isinstance(load_cost(None), OnlineCost)
    assert isinstance(load_cost("online"), OnlineCost)
    cases = {
        "h100": ref8, "h100:qwen3-8b": ref8, "h100:qwen3-1.7b": ref17, "H100:qwen3-1.7b": ref17,
        str(path): ref8, f"{path}:qwen3-1.7b": ref17, str(single): ref17,
    }
    for spec, ref in cases.items():
        cost = load_cost(spec)
        assert isinstance(cost, TableCost), spec
        assert cost.uniform_ms(64, 3, 700) == pytest.approx(ref), spec
    assert load_cost(path).uniform_ms(64, 3, 700) == pytest.approx(ref8)
    assert load_cost({"table": "h100", "shape": "qwen3-1.7b"}).uniform_ms(64, 3, 700) == \
        pytest.approx(ref17)
    assert load_cost({"table": str(path)}).uniform_ms(64, 3, 700) == pytest.approx(ref8)
    cost = tables["qwen3-8b"]
    assert load_cost(cost) is cost
    online = OnlineCost()
    assert load_cost(online) is online


@pytest.mark.parametrize("spec", [
    "h200", "h100:qwen3-70b", "missing.json", "missing.json:qwen3-8b", "", "online:x",
    {"table": "h100", "shape": "qwen3-8b", "extra": 1}, {"table": 3}, 42, ["h100"],
])
def test_load_cost_rejects_bad_specs(spec):
    with pytest.raises(ValueError, match="allowed"):
        load_cost(spec)


def test_load_cost_rejects_bad_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        load_cost(str(bad))
    with pytest.raises(ValueError, match="no shape"):
        load_cost(f"{PACKAGED}:nope")


# -------------------------------------------------------------------------- OnlineCost


def synthetic_steps(n, a, b, c, noise=0.02, seed=0):
    rng = random.Random(seed)
    for _ in range(n):
        size = rng.randint(1, 200)
        widths = [rng.choice([1, 1, 2, 3, 5]) for _ in range(size)]
        contexts = [rng.randint(0, 6000) for _ in range(size)]
        T = sum(widths)
        A = sum(w * (x + w) for w, x in zip(widths, contexts))
        yield widths, contexts, a + b * T + c * A + rng.gauss(0.0, noise)


def test_online_recovers_coefficients():
    cost = OnlineCost()
    for widths, contexts, ms in synthetic_steps(300, 6.0, 0.025, 4e-6):
        cost.observe(widths, contexts, ms)
    a, b, c = cost.coefficients
    assert a == pytest.approx(6.0, rel=0.02)
    assert b == pytest.approx(0.025, rel=0.02)
    assert c == pytest.approx(4e-6, rel=0.02)
    assert cost.fitted and cost.observations == 300
    assert cost.step_ms([1, 2], [100, 200]) == pytest.approx(a + 3 * b + (101 + 404) * c)
    assert cost.uniform_ms(4, 2, 100) == pytest.approx(a + 8 * b + 4 * 2 * 102 * c)
    assert cost.step_ms([], []) == 0.0
    assert "online fit" in cost.describe()


def test_online_coefficients_are_non_negative():
    cost = OnlineCost()
    for widths, contexts, ms in synthetic_steps(100, 5.0, 0.03, -2e-6, noise=0.0):
        cost.observe(widths, contexts, max(ms, 0.0))
    a, b, c = cost.coefficients
    assert min(a, b, c) >= 0 and c == 0.0
    cost = OnlineCost()
    for widths, contexts, ms in synthetic_steps(100, 0.0, 0.03, 0.0, noise=0.0):
        cost.observe(widths, contexts, ms)
    assert cost.coefficients == pytest.approx((0.0, 0.03, 0.0), abs=1e-9)


def test_online_uses_the_prior_until_fitted(tables):
    prior = tables["qwen3-8b"]
    cost = OnlineCost(prior=prior, min_observations=16)
    steps = list(synthetic_steps(16, 2.0, 0.01, 0.0, noise=0.0))
    for widths, contexts, ms in steps[:15]:
        cost.observe(widths, contexts, ms)
    assert not cost.fitted and cost.coefficients is None
    assert cost.step_ms([1] * 16, [256] * 16) == pytest.approx(7.2014)
    assert cost.uniform_ms(16) == pytest.approx(7.2014)
    assert "not fitted" in cost.describe()
    cost.observe(*steps[15])
    assert cost.fitted
    assert cost.uniform_ms(16) == pytest.approx(2.0 + 0.16)
    bare = OnlineCost()
    assert bare.step_ms([1, 1], [0, 0]) == pytest.approx(
        cost_online.DEFAULT_BASE_MS + 2 * cost_online.DEFAULT_TOKEN_MS)


def test_online_refits_lazily_over_a_window():
    cost = OnlineCost(window=64, refit_every=32, min_observations=16)
    for step in synthetic_steps(16, 2.0, 0.01, 0.0, noise=0.0):
        cost.observe(*step)
    first = cost.coefficients
    assert first == pytest.approx((2.0, 0.01, 0.0), abs=1e-9)
    new = list(synthetic_steps(64, 8.0, 0.02, 1e-6, noise=0.0, seed=1))
    for step in new[:31]:
        cost.observe(*step)
    assert cost.coefficients == first                   # not yet 32 new steps
    for step in new[31:]:
        cost.observe(*step)
    assert cost.coefficients == pytest.approx((8.0, 0.02, 1e-6), rel=1e-6)   # old ones left
    with pytest.raises(ValueError):
        cost.observe([1], [1], -1.0)
    with pytest.raises(ValueError):
        OnlineCost(prior="h100")


# ----------------------------------------------------------------------------- project


def test_project_sums_steps(tables):
    t = tables["qwen3-8b"]
    trace = [([1] * 16, [256] * 16), ([1] * 64, [1024] * 64), ([], []), ([3, 1], [100, 900])]
    p = project(trace, t)
    assert isinstance(p, Projection) and p.steps == 4 and p.cost_name == "h100:qwen3-8b"
    assert p.per_step_ms == pytest.approx([7.2014, 10.4498, 0.0, t.step_ms([3, 1], [100, 900])])
    assert p.total_ms == pytest.approx(sum(p.per_step_ms))
    assert project(iter(trace), "h100").total_ms == pytest.approx(p.total_ms)
    assert project([], t).total_ms == 0.0
    with pytest.raises(ValueError):
        project([([1], [2], [3])], t)


def test_step_cost_base_is_abstract():
    with pytest.raises(TypeError, match="abstract"):
        StepCost()


# ---------------------------------------------------------------------------- measure


def test_measure_on_cpu(tmp_path, capsys):
    from vllm_rl.cost import measure

    config = tmp_path / "tiny" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 256}))
    out = tmp_path / "table.json"
    measure.main([str(out), "--device", "cpu", "--config", str(config), "--grid", "tiny",
                  "--max-kv-tokens", "40"])
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["torch"] and data["dtype"] == "float32"
    assert data["shapes"]["tiny"]["kv_heads"] == 2
    cells = {(r["B"], r["q"], r["L"]) for r in data["rows"]}
    # B = 2 at L = 32 needs 2 * 34 > 40 KV tokens: skipped, for every q
    assert cells == {(1, 1, 16), (1, 2, 16), (2, 1, 16), (2, 2, 16), (1, 1, 32), (1, 2, 32)}
    for r in data["rows"]:
        assert set(r) == {"shape", "B", "q", "L", "ms"} and r["shape"] == "tiny"
        assert isinstance(r["ms"], float) and r["ms"] > 0
    assert "[measure] tiny L=16" in capsys.readouterr().out
    table = load_cost(str(out))
    assert table.shape == "tiny" and table.uniform_ms(2, 2, 32) > 0
    with pytest.raises(SystemExit):
        measure.main([str(out), "--device", "cpu"])          # no shape given


def test_linear_at_is_the_tangent_of_eq1():
    from vllm_rl.cost import OnlineCost, load_cost

    online = OnlineCost()
    for b in (1, 2, 4, 8, 16, 64):
        for w in (1, 2, 3):
            online.observe([w] * b, [0] * b, 2.0 + 0.25 * b * w)
    assert online.fitted
    c_base, c_tok = online.linear_at(16, context=0)
    assert c_base == pytest.approx(2.0, rel=1e-3) and c_tok == pytest.approx(0.25, rel=1e-3)
    table = load_cost("h100:qwen3-8b")
    small, large = table.linear_at(16), table.linear_at(512)
    assert small[0] > 0 and large[0] >= 0
    # memory-bound at 16 sequences: a pass dominates; at 512 the tokens do
    assert small[0] / (small[1] * 16) > large[0] / (large[1] * 512)
