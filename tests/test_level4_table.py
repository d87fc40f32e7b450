"""benchmarks/level4.py's arithmetic: the NLL of the runtime's logits equals torch's cross-entropy, the level-4
rows are compared with the same configuration's level-0 row."""

from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture()
def level4(benchmark_module):
    return benchmark_module("level4")


def test_nll_is_cross_entropy(level4):
    rng = np.random.default_rng(0)
    logits = [rng.normal(0, 30, 50).astype(np.float32) for _ in range(7)]  # large logits: the max is subtracted
    targets = [int(t) for t in rng.integers(0, 50, 7)]
    want = torch.nn.functional.cross_entropy(torch.tensor(np.stack(logits), dtype=torch.float64),
                                             torch.tensor(targets), reduction="none").numpy()
    np.testing.assert_allclose(level4.nll(logits, targets), want, rtol=1e-12, atol=1e-12)


def test_level4_rows_against_their_own_level0(level4):
    rows = [dict(method="a", level=0, ppl=20.0, top1=np.array([1, 2, 3, 4])),
            dict(method="a", level=4, ppl=21.0, top1=np.array([1, 2, 0, 4])),
            dict(method="b", level=0, ppl=40.0, top1=np.array([5, 5, 5, 5])),
            dict(method="b", level=4, ppl=30.0, top1=np.array([5, 5, 5, 5]))]
    out = level4.compare(rows)
    assert out[1]["ppl_vs_level0"] == pytest.approx(1.05) and out[1]["top1_agree"] == 0.75
    assert out[3]["ppl_vs_level0"] == pytest.approx(0.75) and out[3]["top1_agree"] == 1.0
    assert "ppl_vs_level0" not in out[0]

