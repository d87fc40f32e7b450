"""benchmarks/read_gaps.py: with --dense-bundle, dense-static's misses are replayed beside the sparse ones, and
the summary gives their read times' ratio per reader at the default gap, where both were replayed."""

from __future__ import annotations


def test_side_by_side_ratio_per_reader_at_the_default_gap(benchmark_module):
    read_gaps = benchmark_module("read_gaps")
    gap = read_gaps.IO_GAP
    rows = [{"bundle": "sparse", "io_engine": "io_uring", "io_gap": 0, "s_per_token": 0.05},
            {"bundle": "sparse", "io_engine": "io_uring", "io_gap": gap, "s_per_token": 0.10},
            {"bundle": "sparse", "io_engine": "threads", "io_gap": gap, "s_per_token": 0.12},
            {"bundle": "dense", "io_engine": "io_uring", "io_gap": gap, "s_per_token": 0.08},
            {"bundle": "dense", "io_engine": "threads", "io_gap": gap, "s_per_token": 0.06}]
    lines = read_gaps.side_by_side(rows, "sparse", "dense")
    assert len(lines) == 2
    assert "io_uring" in lines[0] and "0.80×" in lines[0]  # 0.08 / 0.10, not against gap 0's 0.05
    assert "threads" in lines[1] and "0.50×" in lines[1]
    assert read_gaps.side_by_side(rows, "sparse", None) == []


def test_a_reader_the_sparse_bundle_lacks_gives_no_ratio(benchmark_module):
    read_gaps = benchmark_module("read_gaps")
    gap = read_gaps.IO_GAP
    rows = [{"bundle": "sparse", "io_engine": "threads", "io_gap": gap, "s_per_token": 0.1},
            {"bundle": "dense", "io_engine": "io_uring", "io_gap": gap, "s_per_token": 0.08}]
    assert read_gaps.side_by_side(rows, "sparse", "dense") == []
