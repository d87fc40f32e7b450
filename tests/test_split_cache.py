"""The split search's disk cache (dipdeploy.sparsity.splitcache): asked twice, searched once; another text,
other weights, another density or score: searched again; a damaged entry: searched again."""

import pytest
import torch

from dipdeploy.sparsity.calibrate import calibrate
from dipdeploy.sparsity.plan import SparsityConfig


@pytest.fixture
def counted(monkeypatch, tmp_path):
    monkeypatch.setenv("DIPDEPLOY_CACHE", str(tmp_path))
    calls = []

    def search(lm, cfg, windows):
        calls.append((cfg.density, cfg.score))
        return 0.6, {"split_nll": {"0.600": 1.0}}

    return search, calls


def _windows(seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(seed))


def test_a_split_asked_again_is_not_searched_again(tiny_llama, counted, tmp_path):
    search, calls = counted
    cfg = SparsityConfig(method="dip", density=0.5)
    first = calibrate(tiny_llama, cfg, _windows(0), search=search)
    second = calibrate(tiny_llama, cfg, _windows(0), search=search)
    assert len(calls) == 1 and first.to_json() == second.to_json()
    calibrate(tiny_llama, cfg, _windows(1), search=search)  # another text
    calibrate(tiny_llama, SparsityConfig(method="dip", density=0.6), _windows(0), search=search)
    calibrate(tiny_llama, SparsityConfig(method="dip", density=0.5, score="wina"), _windows(0), search=search)
    assert len(calls) == 4
    for entry in (tmp_path / "splits").iterdir():
        entry.write_text("{not json")
    calibrate(tiny_llama, cfg, _windows(0), search=search)
    assert len(calls) == 5


def test_other_weights_are_searched_again(tiny_llama, counted):
    search, calls = counted
    cfg = SparsityConfig(method="dip", density=0.5)
    calibrate(tiny_llama, cfg, _windows(0), search=search)
    w = tiny_llama.model.model.layers[0].mlp.down_proj.weight
    with torch.no_grad():
        w[0, 0] += 1.0
    try:
        calibrate(tiny_llama, cfg, _windows(0), search=search)
    finally:
        with torch.no_grad():
            w[0, 0] -= 1.0
    assert len(calls) == 2
