"""`dipdeploy bench kernels`: shapes from the registry or RxO, the grid's cases (the dense MatMul beside every
configuration, accuracy level 4 only where it means something), bounded counts, one-line refusals, and a
tiny interleaved run whose rows carry the ratio to the dense kernel. No timing is read."""

import json
from functools import partial

import pytest

from dipdeploy.bench.kernels import KernelGrid, KernelRow, Shape, groups, model_shapes, parse_shape
from dipdeploy.ops.native import library_path
from bench_helpers import assert_published_scenarios, bench, one_line_refusal

needs_library = pytest.mark.skipif(library_path() is None, reason="the op library is not built (`make ops`)")
_kernels = partial(bench, "kernels")


def test_shapes_from_the_registry_and_from_rxo():
    up, down = model_shapes("smollm2-135m")
    assert (up.rows, up.cols, down.rows, down.cols) == (576, 3072, 1536, 576)
    assert parse_shape("64x128") == Shape("64x128", 64, 128)
    for bad, word in (("64*128", "RxO"), ("100x128", "multiple of 32"), ("0x64", ">= 32"),
                      ("131072x131072", "cap")):
        with pytest.raises(ValueError, match=word):
            parse_shape(bad)


def test_cases_put_dense_beside_every_thread_count_and_level_4_only_where_it_applies():
    grid = KernelGrid([Shape("s", 64, 64)], formats=["fp32", "bq4"], densities=[0.25, 0.5], threads=[1, 2],
                      impls=["native", "fallback", "matmulnbits"], levels=[0, 4])
    cases = grid.cases()
    assert len(cases) == len(set(cases))
    assert [(c.impl, c.threads) for c in cases[:2]] == [("dense", 1), ("dense", 2)]
    assert {(c.format, c.impl) for c in cases if c.level == 4} == {("bq4", "native"), ("int4", "matmulnbits")}
    sparse = [c for c in cases if c.impl in ("native", "fallback")]
    assert len(sparse) == 2 * 2 * 2 * 2 + 2 * 2  # formats × ρ × threads × impls, + bq4 native at level 4
    assert sum(c.impl == "matmulnbits" for c in cases) == 4


def test_a_large_fallback_is_timed_alone():
    grid = KernelGrid([Shape("big", 4096, 4096), Shape("small", 64, 64)], impls=["native", "fallback"])
    cases = grid.cases()
    together = groups(cases)
    alone = [g for g in together if len(g) == 1]
    assert len(alone) == 1 and cases[alone[0][0]].impl == "fallback" and cases[alone[0][0]].shape.name == "big"


def test_counts_are_bounded():
    with pytest.raises(ValueError, match="cap of 2000"):
        KernelGrid([Shape("s", 64, 64)], formats=["fp32", "fp16", "bq4", "vq3"], densities=[0.1, 0.2, 0.3, 0.4],
                   threads=[1, 2, 3, 4], repetitions=100).cases()
    with pytest.raises(ValueError, match="--calls"):
        KernelGrid([Shape("s", 64, 64)], calls=10**6)
    with pytest.raises(ValueError, match="give shapes"):
        KernelGrid([])


@pytest.mark.parametrize("args, words", [
    ([], ["-m", "--shape"]),
    (["--shape", "64x100"], ["multiple of 32"]),
    (["--shape", "64x64", "--quant", "int2"], ["--quant", "int2"]),
    (["--shape", "64x64", "--accuracy-level", "2"], ["--accuracy-level"]),
    (["--shape", "64x64", "--calls", "0"], ["--calls"]),
    (["--shape", "64x64", "--kernel-set", "avx9000"], ["--kernel-set"]),
    (["-m", "no-such-model"], ["no-such-model", "registry"]),
])
def test_bad_input_is_refused_in_one_line(args, words):
    one_line_refusal(_kernels(*args), *words)


@needs_library
def test_a_tiny_run_gives_rows_with_the_ratio_to_dense():
    res = _kernels("--shape", "64x64", "--quant", "bq4,fp32", "--impl", "native,matmulnbits", "-r", "2",
                   "--calls", "2", "-o", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "dipdeploy.bench.kernels"
    rows = [KernelRow(**r) for r in doc["rows"]]
    assert [(r.format, r.impl) for r in rows] == [("fp32", "dense"), ("bq4", "native"), ("fp32", "native"),
                                                   ("int4", "matmulnbits")]
    assert rows[0].x_dense == 1.0 and all(r.x_dense and r.x_dense > 0 for r in rows)
    assert all(r.repetitions == 2 and r.calls == 2 and r.cpu_us is not None for r in rows)
    assert rows[1].weight_mb < rows[2].weight_mb  # BQ4 rows are smaller than fp32 ones


@needs_library
def test_a_capped_kernel_set_runs_in_a_process_of_its_own():
    res = _kernels("--shape", "32x64", "--kernel-set", "portable", "-r", "1", "--calls", "1", "-o", "json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert rows and {r["kernel_set"] for r in rows} == {"portable"}


def test_the_scenarios_of_the_published_kernel_tables_load():
    assert_published_scenarios("kernels", ("kernels", "kernels-smollm2"))
