"""The AUC gate's measurement (``vllm-rl bench arrol-gate``) on constructed groups."""
from __future__ import annotations

import numpy as np
import pytest

from vllm_rl.arrol.measures import grouped_auc
from vllm_rl.bench.arrol_gate import GRID, balance, binormal_scores, gate


def _groups(a: float, b: float, seed: int = 0, n: int = 64, size: int = 16):
    rng = np.random.default_rng(seed)
    return [(rng.uniform(size=size) < q).astype(float) for q in rng.beta(a, b, n)]


@pytest.mark.parametrize("auc", [0.6, 0.75, 0.9])
def test_binormal_scores_have_the_asked_within_group_auc(auc):
    rng = np.random.default_rng(1)
    y = (rng.uniform(size=20000) < 0.4).astype(float)
    groups = np.arange(len(y)) // 16
    s = binormal_scores(y, auc, rng)
    assert grouped_auc(s, y.astype(int), np.ones_like(y), groups) == pytest.approx(auc, abs=0.02)


def test_mostly_correct_groups_gain_from_a_ranking_head_and_keep_kappa():
    """Eq. 2 prunes the likelier-correct samples harder, so groups above ρ move toward it
    once the head ranks well, and never with a head that cannot rank (AUC 0.5: only
    fewer samples, more noise)."""
    groups = _groups(4, 1, n=256)
    rows = [balance(groups, a, seed=k, draws=100, boot=300) for k, a in enumerate(GRID)]
    assert rows[0]["gain"] < 0 and rows[-1]["gain"] > 0
    assert rows[-1]["gain_vs_random"] > rows[0]["gain_vs_random"]
    assert all(r["kept_share"] == pytest.approx(0.5, abs=0.03) for r in rows)
    g = gate(rows)
    assert g is not None and 0.6 <= g <= 0.95
    assert gate(rows, "gain_vs_random_lo") <= g


def test_mostly_wrong_groups_never_gain():
    """Groups below ρ: pruning the likelier-correct samples moves them away from ρ, the
    better the head ranks (δ absorbs ρ in Eq. 2 once E[p] = κ is imposed)."""
    rows = [balance(_groups(1, 4), a, seed=k, draws=100, boot=300)
            for k, a in enumerate(GRID)]
    assert gate(rows) is None
    assert rows[-1]["gain"] < rows[0]["gain"] < 0
