"""`dipdeploy bench reads`: the grid expands its comma lists without the cases a flag does not apply to,
every count is bounded and bad input is refused in one line (exit 2) before any file is written, and a tiny
run through the runtime's reader gives one row per configuration in the one row schema. No timing is read."""

import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from dipdeploy.bench import read_sources as rs
from dipdeploy.bench.reads import SCRATCH, ReadGrid, ReadRow, side_by_side
from bench_helpers import assert_published_scenarios, bench, one_line_refusal

_reads = partial(bench, "reads")


def test_flags_that_do_not_apply_to_an_io_mode_leave_no_duplicate_cases():
    grid = ReadGrid(ios=["dram", "mmap", "direct"], row_bytes=[288, 1536], engines=["threads", "io_uring"],
                    gaps=[0, 4], caches=["cold", "warm"], orders=["sorted", "shuffled"])
    cases = grid.cases()
    assert len(cases) == len(set(cases))
    per_shape = {"dram": 2, "mmap": 2, "direct": 4}  # orders; caches; engines × gaps
    for io, n in per_shape.items():
        assert sum(c.io == io for c in cases) == 2 * n
    assert all(c.gap is None and c.engine is None for c in cases if c.io != "direct")
    assert all(c.cache is None for c in cases if c.io in ("dram", "direct"))
    assert [c.row_bytes for c in cases if c.io == "mmap"] == [288, 288, 1536, 1536]  # flag order


def test_a_bundle_source_skips_dram_and_takes_budgets():
    grid = ReadGrid(bundles=["b1", "b2"], ios=["dram", "direct"], budgets=["25%", "50%"])
    cases = grid.cases()
    assert {c.io for c in cases} == {"direct"} and len(cases) == 4
    assert all(c.row_bytes is None and c.budget for c in cases)


def test_counts_are_bounded():
    with pytest.raises(ValueError, match="cap of 2000"):
        ReadGrid(row_bytes=list(range(1, 31)), densities=[0.1 * i for i in range(1, 11)], repetitions=10).cases()
    with pytest.raises(ValueError, match="--size"):
        ReadGrid(size=1 << 40)
    with pytest.raises(ValueError, match="larger than --size"):
        ReadGrid(row_bytes=[2 << 20], size=1 << 20)
    with pytest.raises(ValueError, match="--tokens"):
        ReadGrid(tokens=10_000)


def test_scratch_batches_are_one_call_per_group_of_ascending_rows():
    batches = rs.scratch_batches(64 << 20, 1024, 0.5)
    assert len(batches) == (64 << 20) // 1024 // rs.GROUP_ROWS
    for b in batches:
        assert (np.diff(b.rows) > 0).all() and b.rows[-1] < rs.GROUP_ROWS and len(b.rows) >= 1


@pytest.mark.parametrize("args, words", [
    (["--io", "floppy"], ["--io", "floppy"]),
    (["--gap", "999"], ["--gap", "cap"]),
    (["--depth", "0"], ["--depth"]),
    (["--density", "0"], ["--density"]),
    (["--row-bytes", "1,,2"], ["empty item"]),
    (["-m", "no-such-bundle"], ["no-such-bundle", "bundle"]),
    (["--size", "lots"], ["--size"]),
    (["-r", "0"], ["--repetitions"]),
])
def test_bad_input_is_refused_in_one_line(args, words, tmp_path):
    res = _reads(*args, "--dir", str(tmp_path))
    one_line_refusal(res, *words)
    assert not any(tmp_path.iterdir())  # refused before the scratch file is written


def test_a_tiny_run_gives_a_row_per_configuration(tmp_path):
    res = _reads("--io", "pread,direct", "--gap", "0,4", "--size", "1MiB", "--row-bytes", "4096", "-r", "2",
                 "--dir", str(tmp_path), "-o", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "dipdeploy.bench.reads" and doc["header"]["suite"] == "reads"
    assert doc["header"]["machine"]["cpu"]
    rows = [ReadRow(**r) for r in doc["rows"]]
    assert [(r.io, r.gap) for r in rows] == [("pread", None), ("direct", 0), ("direct", 4)]
    for r in rows:
        assert r.repetitions == 2 and r.source == SCRATCH and r.calls == 1
        assert r.mb_read >= r.mb_wanted > 0 and r.requests >= 1
        assert r.read_over_wanted == pytest.approx(r.mb_read / r.mb_wanted)
    assert "--gap 0,4" in doc["header"]["command"]


@pytest.mark.skipif(shutil.which("g++") is None, reason="the DRAM probe needs g++")
def test_the_dram_probe_reads_every_row_at_density_one(tmp_path):
    exe = rs.probe_binary(tmp_path)
    seconds, rows = rs.dram_pass(exe, 1 << 20, 1024, 1.0, 0, "shuffled", passes=1)
    assert rows == 1024 and seconds > 0
    assert rs.dram_pass(exe, 1 << 20, 1024, 0.5, 16, "shuffled", passes=1)[1] < 1024


def _row(source, engine, gap, ms):
    return ReadRow(source, "direct", None, None, None, None, engine, gap, None, None, "50%", 1.0, 0.0, 1.0, 1.0,
                   1.0, 1.0, 1.0, 1.0, 1, 1, ms_per_token=ms)


def test_dense_static_beside_a_sparse_bundle_gives_their_ratio_per_reader_and_gap():
    rows = [_row("sparse", "io_uring", 4, 100.0), _row("sparse", "threads", 4, 120.0),
            _row("dense", "io_uring", 4, 80.0), _row("dense", "threads", 0, 60.0)]
    lines = side_by_side(rows, {"dense"})
    assert len(lines) == 1 and "io_uring" in lines[0] and "0.80×" in lines[0]
    assert side_by_side(rows, set()) == []


def test_the_scenarios_of_the_published_read_tables_load():
    assert_published_scenarios("reads", ("reads-dram", "reads-gaps-llama-1b"))


def test_a_scenario_flag_of_the_wrong_type_is_refused(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('suite = "reads"\n[flags]\ntokens = "many"\n')
    one_line_refusal(_reads("--scenario", str(bad)), "tokens", "whole number")


def test_a_bundle_replays_its_own_decode_misses(tiny_dipca_bundle, tmp_path):
    bundle = tiny_dipca_bundle()
    res = _reads("-m", str(bundle), "--io", "pread,direct", "--budget", "10%", "--tokens", "3", "-r", "1",
                 "--dir", str(tmp_path), "-o", "json")
    assert res.exit_code == 0, res.output
    rows = [ReadRow(**r) for r in json.loads(res.stdout)["rows"]]
    assert [r.io for r in rows] == ["pread", "direct"]
    assert all(r.source == Path(bundle).name and r.budget == "10%" and r.ms_per_token for r in rows)
    assert rows[0].mb_wanted == rows[1].mb_wanted  # the same misses, whichever reader
    assert len(list((tmp_path / "traces").iterdir())) == 1  # one decode's trace, reused by both
