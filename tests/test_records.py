"""A weight format and a cache policy are one record each per language (issue #55).

Adding a format is one ``WeightFormat`` in ``dipdeploy.ops.formats.FORMATS`` (plus its kernel in
``custom_ops``, whose enumerator, name and bytes the record names); adding a policy is one ``Policy`` in
``dipdeploy.cache.policies.POLICY_RECORDS``, one constant of the Java ``RowCache.Policy`` and one
enumerator of ``custom_ops/src/cache/``. These tests hold that true from outside:

- every record is complete: each place that needs the format (packing, array labels, dtypes, numpy and
  ONNX decoders, quant preset, bits for the simulator, export choices) works from the record alone;
- the Java engine mirrors the policy records (parsed from its source; the native library's traits tables
  are held to the same records through its C ABI by tests/test_traits_native.py);
- no module outside the records' compares a format or policy name, or keys a table by one (an AST scan),
  and no Java engine source outside the enum compares a policy name. The allow-list below is exact: an
  entry that no longer occurs fails too, so it cannot rot.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from dipdeploy.cache import POLICIES, POLICY_RECORDS, RowCache, policy_of
from dipdeploy.export.config import EXPORT_QUANTS
from dipdeploy.ops.fallback import SgmmVariant, sparse_gather_matmul_function
from dipdeploy.ops.formats import FORMATS, OpWeights, format_of_config
from dipdeploy.ops.native import session_options
from dipdeploy.ops.nodes import make_sgmm_model
from dipdeploy.ops.reference import sparse_gather_matmul_ref
from dipdeploy.quant.api import quantize
from dipdeploy.quant.config import QUANT_PRESETS
from dipdeploy.sim.precision import bits_per_weight
from dipdeploy.sparsity.plan import CA_POLICIES

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dipdeploy"
RECORD_MODULES = {"dipdeploy/ops/formats.py", "dipdeploy/cache/policies.py"}
JAVA = ROOT / "android_demo/engine/src/main/java/ai/dipdeploy/engine"

FORMAT_NAMES = set(FORMATS)
POLICY_NAMES = set(POLICIES)

# (file, the comparison or dict as ast.unparse writes it): why it may name a format or policy.
ALLOWED = {
    ("dipdeploy/export/blocks.py", "lin.kind == 'fp32'"):
        "a dense Linear's storage kind (fp32 | nbits | tied), a vocabulary of its own, not an MLP weight format",
    ("dipdeploy/export/blocks.py", "emb.kind == 'fp32'"):
        "the embedding's storage kind (fp32 | int4, defaults.EMBEDDINGS), not an MLP weight format",
    ("dipdeploy/quant/config.py", "QUANT_PRESETS"):
        "the quantiser's CLI presets (11 names, rtn3 has no op format) at floor 2, below the records; "
        "test_every_format_record_is_complete holds each quantised record to its preset",
}


def _weights(name: str, rows: int = 64, cols: int = 128) -> OpWeights:
    """A row matrix in format ``name``, made from its record alone."""
    fmt = FORMATS[name]
    w = np.random.default_rng(rows + cols).standard_normal((rows, cols)).astype(np.float32)
    if not fmt.quantised:
        return OpWeights.from_matrix(w.astype(fmt.dtypes[0]))
    return OpWeights.from_packed(quantize(w, fmt.config(**dict(fmt.requires))))


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_record_is_complete(name):
    fmt = FORMATS[name]
    assert fmt.name == name and len(fmt.arrays) == len(fmt.dtypes) and 0 <= fmt.n_optional < len(fmt.dtypes)
    ow = _weights(name)
    assert ow.format == name  # packing: the record's dtype or config leads back to the record
    assert len(ow.arrays) >= fmt.n_required
    if fmt.quantised:
        assert tuple(ow.packed.arrays()) == fmt.arrays[: len(ow.arrays)]  # the labels are the packed arrays'
        assert format_of_config(fmt.config) is fmt
        cls, preset = QUANT_PRESETS[name]  # the CLI preset of the same name packs this format
        assert cls is fmt.config and not preset
        assert name in EXPORT_QUANTS
        assert bits_per_weight(name) > fmt.code_bits  # codes plus their scales or codebooks
    else:
        assert bits_per_weight(name) == fmt.code_bits == 8 * np.dtype(fmt.dtypes[0]).itemsize
    own = ow.arrays[0]  # the codes: code_bits per weight (cols a multiple of every block and vector)
    assert own[0].nbytes * 8 == fmt.code_bits * ow.cols
    # the numpy and the ONNX decoders: the fallback function on stock ORT equals the reference
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, ow.rows)).astype(np.float32)
    idx = np.stack([rng.permutation(ow.rows)[:20] for _ in range(2)]).astype(np.int64)
    for slab in (False, True):
        w, feeds = ow, {"X": x, "indices": idx}
        if slab:
            w = ow.slab(np.arange(ow.rows)[::-1].copy())
            feeds["slots"] = ow.rows - 1 - idx
        sess = ort.InferenceSession(make_sgmm_model(w, ow.rows, slab=slab).SerializeToString(),
                                    session_options(1, native=False), providers=["CPUExecutionProvider"])
        y = sess.run(None, feeds)[0]
        ref = sparse_gather_matmul_ref(x, idx, w, feeds.get("slots"))
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    if fmt.int8:
        sparse_gather_matmul_function(SgmmVariant(name, int8=True))
    else:
        with pytest.raises(ValueError, match="needs format"):
            SgmmVariant(name, int8=True)


def test_the_java_engine_mirrors_the_policy_records():
    """The Java engine's ``RowCache.Policy`` enum: one constant per record, in order, with its traits (the
    C++ tables are held to the records through the library, tests/test_traits_native.py)."""
    java = (JAVA / "RowCache.java").read_text()
    body = re.search(r"public enum Policy \{(.*?)\n        public final", java, re.S).group(1)
    consts = re.findall(r'(\w+)\("(\w+)",\s*(true|false),\s*(true|false),\s*(true|false),\s*(true|false)\)\s*([{,;])',
                        body)
    assert [c[1] for c in consts] == list(POLICIES)  # same order: the ordinal is the native code
    for const, name, updates, zero, future, pinned, opens in consts:
        p = POLICY_RECORDS[name]
        assert const == name.upper()
        assert [updates, zero, future, pinned] == [str(v).lower() for v in
                                                    (p.updates, p.zero_capacity, p.needs_future, p.pinned)]
        assert (opens == "{") == p.updates, f"{const}: a key body exactly when the policy updates"


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_record_says_what_its_cache_does(name):
    p = policy_of(name)
    rng = np.random.default_rng(1)
    trace = np.stack([rng.permutation(32)[:6] for _ in range(40)])
    kw = {"future": trace if p.needs_future else None,
          "pinned": (np.arange(32) < 4) if p.pinned else None}
    for need in ("future", "pinned"):
        if kw[need] is not None:
            with pytest.raises(ValueError, match=f"policy '{name}' needs the {need}"):
                RowCache(32, 8, name, **{**kw, need: None})
    cache = RowCache(32, 8, name, **kw)
    assert (cache.capacity == 0) == p.zero_capacity
    before = cache.resident.copy()
    for sel in trace:
        cache.access(sel[None])
    assert (not np.array_equal(cache.resident, before)) == p.updates
    if not p.stepwise:  # admitting several steps at once leaves what stepping does
        batched = RowCache(32, 8, name, **kw)
        batched.access_steps(trace)
        assert np.array_equal(batched.resident, cache.resident)
    assert (name in CA_POLICIES) == (p.updates and not p.needs_future)


def _names_in(node: ast.AST) -> set[str]:
    """The string constants of a comparison operand or dict key, looking into tuples, lists and sets."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    return set()


def _name_literals(tree: ast.AST) -> list[tuple[str, set[str]]]:
    """(where, names) for every comparison, ``match`` case or dict literal naming a format or policy.

    ``"none"`` is also a quant preset, a checksum level, a Hessian kind…: it counts as a policy only in a
    comparison whose other side mentions a policy or is a loop variable over policies."""
    over_policies = {ast.unparse(n.target) for n in ast.walk(tree)  # loop variables over policies
                     if isinstance(n, (ast.For, ast.comprehension)) and "polic" in ast.unparse(n.iter)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            named = set().union(*(_names_in(o) for o in operands))
            policy_side = any("polic" in ast.unparse(o) or ast.unparse(o) in over_policies for o in operands)
            hits = named & (FORMAT_NAMES | POLICY_NAMES - {"none"} | ({"none"} if policy_side else set()))
            if hits:
                out.append((ast.unparse(node), hits))
        elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
            hits = _names_in(node.pattern.value) & (FORMAT_NAMES | POLICY_NAMES - {"none"})
            if hits:
                out.append((ast.unparse(node.pattern), hits))
        elif isinstance(node, ast.Dict):
            keys = set().union(*(_names_in(k) for k in node.keys if k is not None))
            hits = keys & (FORMAT_NAMES | POLICY_NAMES - {"none"})
            if hits:
                out.append((ast.unparse(node), hits))
    return out


def test_no_format_or_policy_name_is_compared_outside_its_record():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in RECORD_MODULES:
            continue
        tree = ast.parse(path.read_text())
        assigned = {ast.unparse(n.value): n.targets[0] if isinstance(n, ast.Assign) else n.target
                    for n in ast.walk(tree) if (isinstance(n, ast.Assign) and len(n.targets) == 1)
                    or (isinstance(n, ast.AnnAssign) and n.value is not None)}
        for where, names in _name_literals(tree):
            target = assigned.get(where)
            key = (rel, ast.unparse(target) if target is not None else where)
            found[key] = names
    unexplained = sorted(k for k in found if k not in ALLOWED)
    assert not unexplained, f"format/policy names outside their records (look them up instead): {unexplained}"
    gone = sorted(k for k in ALLOWED if k not in found)
    assert not gone, f"allow-list entries that no longer occur (remove them): {gone}"


def test_no_java_engine_source_compares_a_policy_name():
    names = "|".join(POLICIES)
    for path in sorted(JAVA.glob("*.java")):
        text = path.read_text()
        if path.name == "RowCache.java":  # the enum's constants name each policy once
            text = re.sub(r"public enum Policy \{.*?\n    \}\n", "", text, flags=re.S)
        hits = re.findall(rf'(?:equals\("(?:{names})"\)|case "(?:{names})"|"(?:{names})"\.equals)', text)
        assert not hits, f"{path.name} compares policy names {hits}; ask RowCache.Policy.of(name) instead"
