"""The op library's traits tables equal the Python records they mirror.

The C++ side holds one weight-format table (custom_ops/src/kernels/formats.h) and one cache-policy table
(custom_ops/src/cache/policy.h), read through the library's C ABI (``dd_format_*``, ``dd_policy_*``).
The Python side is :func:`python_records`, the one place to repoint when the Python records move or are
renamed. Skips when the library is not built (``make ops``).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from dipdeploy.ops.native import library_path

BAD_ARGS = -6
POLICY_TRAITS = ("updates", "needs_future", "pinned", "bypass", "no_capacity")


def python_records() -> tuple[list[dict], list[dict]]:
    """(formats, policies) as Python defines them, in their order: the ``WeightFormat`` records
    (``dipdeploy.ops.formats.FORMATS``) and the ``Policy`` records (``dipdeploy.cache.policies``), with
    ``bypass`` (a selected row may be out of the cache after its step), which no Python record states,
    taken from what ``RowCache`` does on a small random trace."""
    from dipdeploy.cache.policies import POLICY_RECORDS, RowCache
    from dipdeploy.ops.formats import FORMATS

    formats = [{"name": f.name, "dtypes": tuple(f.dtypes), "n_optional": f.n_optional, "quantised": f.quantised,
                "shared": tuple(f.shared), "bits": f.code_bits} for f in FORMATS.values()]

    rows, cap, k, steps = 8, 4, 2, 40
    trace = np.stack([np.random.default_rng(t).permutation(rows)[:k] for t in range(steps)])
    pinned = np.arange(rows) < 2
    policies = []
    for p in POLICY_RECORDS.values():
        cache = RowCache(rows, cap, p.name, future=trace, pinned=pinned)
        bypass = False
        for sel in trace:
            cache.access(sel[None])
            bypass |= not cache.resident[0, sel].all()
        policies.append({"name": p.name, "updates": p.updates, "needs_future": p.needs_future, "pinned": p.pinned,
                         "bypass": bypass, "no_capacity": p.zero_capacity, "step_keyed": p.stepwise})
    return formats, policies


@pytest.fixture(scope="module")
def lib():
    path = library_path()
    if path is None:
        pytest.skip("native op library not built (run `make ops`)")
    lib = ctypes.CDLL(str(path))
    i64, s = ctypes.c_int64, ctypes.c_char_p
    sp, ip = ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_int64)
    for name, res, args in (
        ("dd_format_count", i64, []), ("dd_format_name", s, [i64]), ("dd_format_trait", i64, [i64, s]),
        ("dd_format_array", i64, [i64, i64, sp, sp, ip, ip]),
        ("dd_policy_count", i64, []), ("dd_policy_name", s, [i64]), ("dd_policy_trait", i64, [i64, s]),
        ("dd_policy_key", i64, [i64, sp, sp]),
    ):
        fn = getattr(lib, name, None)
        if fn is None:
            pytest.fail(f"{path} has no {name}: rebuild it (make ops)")
        fn.restype, fn.argtypes = res, args
    return lib


def native_formats(lib) -> list[dict]:
    out = []
    for f in range(lib.dd_format_count()):
        arrays = []
        for a in range(lib.dd_format_trait(f, b"arrays")):
            name, dtype, rank, shared = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_int64(), ctypes.c_int64()
            assert lib.dd_format_array(f, a, name, dtype, rank, shared) == 0
            arrays.append((name.value.decode(), dtype.value.decode(), rank.value, shared.value))
        out.append({"name": lib.dd_format_name(f).decode(), "arrays": arrays,
                    **{t: lib.dd_format_trait(f, t.encode()) for t in
                       ("optional", "packed", "bits", "block_min", "grouped", "int8_level4")}})
    return out


def native_policies(lib) -> list[dict]:
    out = []
    for p in range(lib.dd_policy_count()):
        primary, secondary = ctypes.c_char_p(), ctypes.c_char_p()
        assert lib.dd_policy_key(p, primary, secondary) == 0
        out.append({"name": lib.dd_policy_name(p).decode(),
                    **{t: lib.dd_policy_trait(p, t.encode()) for t in POLICY_TRAITS + ("step_keyed",)},
                    "key": (primary.value.decode(), secondary.value.decode())})
    return out


def test_formats_equal_python(lib) -> None:
    py, native = python_records()[0], native_formats(lib)
    assert [f["name"] for f in native] == [f["name"] for f in py]
    for n, p in zip(native, py):
        assert tuple(a[1] for a in n["arrays"]) == p["dtypes"], n["name"]
        assert n["optional"] == p["n_optional"], n["name"]
        assert n["packed"] == int(p["quantised"]), n["name"]
        assert tuple(i for i, a in enumerate(n["arrays"]) if a[3]) == p["shared"], n["name"]
        assert n["bits"] == p["bits"], n["name"]


def test_formats_are_consistent(lib) -> None:
    for f in native_formats(lib):
        assert all(a[2] >= 2 for a in f["arrays"]) and len({a[0] for a in f["arrays"]}) == len(f["arrays"]), f
        assert 1 <= f["bits"] <= 32 and (f["packed"] or f["bits"] in (16, 32)), f
        assert not (f["block_min"] or f["grouped"] or f["int8_level4"]) or f["packed"], f


def test_policies_equal_python(lib) -> None:
    py, native = python_records()[1], native_policies(lib)
    assert [p["name"] for p in native] == [p["name"] for p in py]
    for n, p in zip(native, py):
        assert {t: bool(n[t]) for t in POLICY_TRAITS + ("step_keyed",)} == {
            t: p[t] for t in POLICY_TRAITS + ("step_keyed",)}, n["name"]


def test_policy_keys_are_consistent(lib) -> None:
    for p in native_policies(lib):
        assert (p["key"][0] != "0") == bool(p["updates"]), p
        assert bool(p["step_keyed"]) == ("next_use" in p["key"]) == bool(p["needs_future"]), p


def test_out_of_range_is_refused(lib) -> None:
    nf, npol = lib.dd_format_count(), lib.dd_policy_count()
    assert lib.dd_format_name(nf) is None and lib.dd_format_name(-1) is None
    assert lib.dd_policy_name(npol) is None
    assert lib.dd_format_trait(0, b"no such trait") == BAD_ARGS
    assert lib.dd_format_trait(nf, b"bits") == BAD_ARGS
    assert lib.dd_policy_trait(npol, b"updates") == BAD_ARGS
    assert lib.dd_policy_trait(0, b"no such trait") == BAD_ARGS
    c, i = ctypes.c_char_p(), ctypes.c_int64()
    assert lib.dd_format_array(0, lib.dd_format_trait(0, b"arrays"), c, c, i, i) == BAD_ARGS
    assert lib.dd_policy_key(npol, c, c) == BAD_ARGS
