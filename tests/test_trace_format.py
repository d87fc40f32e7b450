"""The trace file: round trip, atomic no-clobber writes, refusal of unknown versions and broken files."""

import json

import numpy as np
import pytest

from dipdeploy.sim.synthetic import synthetic_trace
from dipdeploy.trace import TRACE_VERSION, Trace, TraceError, TraceRecorder, mlp_density


def test_roundtrip_keeps_every_field(tmp_path):
    tr = synthetic_trace(hidden_size=16, intermediate_size=48, num_layers=3, tokens=5, seed=1)
    tr.meta["dataset"] = "synthetic"
    path = tr.save(tmp_path / "t.npz")
    back = Trace.load(path)
    assert back.header() == tr.header()
    for name in ("sel_in", "sel_glu", "x_abs", "glu_abs"):
        for a, b in zip(getattr(tr, name), getattr(back, name)):
            np.testing.assert_array_equal(a, b)
    assert back.hits_in is None and back.k_in == [8] * 3 and back.num_tokens == 5


def test_optional_magnitudes_and_hits(tmp_path):
    tr = synthetic_trace(16, 48, 2, tokens=4, magnitudes=False)
    tr.hits_in = [np.zeros_like(s, dtype=bool) for s in tr.sel_in]
    tr.hits_glu = [np.ones_like(s, dtype=bool) for s in tr.sel_glu]
    back = Trace.load(tr.save(tmp_path / "t.npz"))
    assert back.x_abs is None and not back.has_magnitudes
    assert back.hits_glu[1].all() and not back.hits_in[0].any()


def test_save_refuses_to_clobber(tmp_path):
    tr = synthetic_trace(16, 48, 1, tokens=2)
    tr.save(tmp_path / "t.npz")
    with pytest.raises(FileExistsError, match="--force"):
        tr.save(tmp_path / "t.npz")
    tr.save(tmp_path / "t.npz", force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["t.npz"]  # no temp files left behind


def _rewrite_header(path, **changes):
    z = dict(np.load(path))
    head = json.loads(str(z["header"]))
    head.update(changes)
    for k in [k for k, v in changes.items() if v is None]:
        head.pop(k)
    z["header"] = np.array(json.dumps(head))
    np.savez(path, **z)


def test_unknown_version_is_refused_with_the_fix(tmp_path):
    path = synthetic_trace(16, 48, 1, tokens=2).save(tmp_path / "t.npz")
    _rewrite_header(path, version=TRACE_VERSION + 1)
    with pytest.raises(TraceError, match="version .* not supported.*dipdeploy trace"):
        Trace.load(path)


def test_missing_header_field_and_array_are_named(tmp_path):
    path = synthetic_trace(16, 48, 2, tokens=2).save(tmp_path / "t.npz")
    _rewrite_header(path, density=None)
    with pytest.raises(TraceError, match="lacks density"):
        Trace.load(path)
    path2 = synthetic_trace(16, 48, 2, tokens=2).save(tmp_path / "u.npz")
    z = dict(np.load(path2))
    del z["sel_glu.1"]
    np.savez(path2, **z)
    with pytest.raises(TraceError, match="sel_glu.1"):
        Trace.load(path2)


def test_not_a_trace(tmp_path):
    bad = tmp_path / "x.npz"
    bad.write_text("hello")
    with pytest.raises(TraceError, match="not a dipdeploy trace"):
        Trace.load(bad)
    with pytest.raises(FileNotFoundError, match="dipdeploy trace"):
        Trace.load(tmp_path / "missing.npz")


def test_validation_catches_bad_arrays():
    sel = [np.array([[0, 1]])]
    kw = dict(source="torch", model="m", hidden_size=4, intermediate_size=8, num_layers=1, method="dip", density=0.5)
    with pytest.raises(TraceError, match=r"row indices must lie in \[0, 4\)"):
        Trace(sel_in=[np.array([[0, 4]])], sel_glu=sel, **kw)
    with pytest.raises(TraceError, match="tokens"):
        Trace(sel_in=sel, sel_glu=[np.array([[0], [1]])], **kw)
    with pytest.raises(TraceError, match="method 'magic' unknown"):
        Trace(sel_in=sel, sel_glu=sel, **{**kw, "method": "magic"})
    with pytest.raises(TraceError, match="x_abs"):
        Trace(sel_in=sel, sel_glu=sel, x_abs=[np.ones((1, 3))], **kw)


def test_recorder_accumulates_prefill_and_decode():
    rec = TraceRecorder(source="torch", model="m", hidden_size=8, intermediate_size=16, num_layers=2,
                        method="dip", density=mlp_density(4, 8, 8, 16))
    rng = np.random.default_rng(0)
    for n in (3, 1, 1):  # a prefill of 3 tokens, then two decode steps
        for layer in range(2):
            rec.record(layer, rng.integers(0, 8, (n, 4)), rng.integers(0, 16, (n, 8)),
                       x_abs=rng.random((n, 8)), glu_abs=rng.random((n, 16)))
    tr = rec.finish()
    assert tr.num_tokens == 5 and tr.has_magnitudes and tr.x_abs[1].dtype == np.float16
    assert tr.measured_density() == pytest.approx(0.5)


def test_recorder_rejects_uneven_layers():
    rec = TraceRecorder(source="torch", model="m", hidden_size=8, intermediate_size=16, num_layers=2,
                        method="dip", density=0.5)
    rec.record(0, [[1, 2]], [[3]])
    with pytest.raises(TraceError, match="sel_in"):
        rec.finish()
    with pytest.raises(TraceError, match="layer 5"):
        rec.record(5, [[1]], [[1]])
