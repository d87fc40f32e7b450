"""ORT threads of the host runtime (``dipdeploy.runtime.threadpool``): 2 threads agree with 1 thread and
with ``model.onnx`` in either pool mode (by ``dipdeploy.agreement``: a thread count changes summation
orders), and the shared pool's once-per-process rule refuses what ORT cannot give, in one line.

A shared pool is its process's for good (ORT then refuses per-session sessions, ``model.onnx``'s too),
so the shared-pool engines run in a child process (``_shared_child``) and the checks here compare."""

import json
import pickle
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from dipdeploy.agreement import Tolerance, compare_logits, tolerance_for
from dipdeploy.cli import app
from dipdeploy.ops.native import library_path, session_options
from dipdeploy.runtime import Engine
from dipdeploy.runtime.threadpool import GlobalPool, pool_options
from twin_checks import assert_runs_agree, model_onnx_run

pytestmark = pytest.mark.numerics

PROMPT = [3, 14, 15, 92, 65, 35, 8, 97]
NATIVE = library_path() is not None  # the native kernels split work over ORT's threads: the path that matters
SPARSE = tolerance_for(sparse=True, quantised=True)

_CHILD = textwrap.dedent("""
    import pickle, sys
    from dipdeploy.runtime import Engine
    from dipdeploy.runtime.threadpool import GlobalPool, ThreadPoolConflict
    bundle, native, out = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    prompt = [int(t) for t in sys.argv[4].split(",")]
    res = {}
    eng = Engine(bundle, dram_budget="100%", single_session=False, fused=False, gamma=1.0, native=native, prefill="token", threads=2,
                 thread_pool="shared")
    g = eng.generate(prompt, 6, stop_at_eos=False)
    res["tokens"] = g.tokens
    res["logits"], res["sel"] = eng.teacher_forced(prompt, g.tokens)
    batch = Engine(bundle, dram_budget="50%", policy="lfu", native=native, threads=2, thread_pool="shared")
    res["batch"] = batch.generate(prompt, 1, keep_logits=True, stop_at_eos=False).logits
    for name, make in (("other size", lambda: Engine(bundle, native=native, threads=3, thread_pool="shared")),
                       ("per-session", lambda: Engine(bundle, native=native, threads=1)),
                       ("outside", lambda: GlobalPool().claim(2))):
        try:
            make()
            res[name] = None
        except ThreadPoolConflict as e:
            res[name] = str(e)
    pickle.dump(res, open(out, "wb"))
""")


@pytest.fixture(scope="module")
def shared_child(tiny_dipca_bundle, tmp_path_factory):
    """What the child process's shared-pool engines (2 threads) gave and refused."""
    out = tmp_path_factory.mktemp("shared") / "res.pkl"
    done = subprocess.run([sys.executable, "-c", _CHILD, str(tiny_dipca_bundle()), "1" if NATIVE else "0", str(out),
                           ",".join(map(str, PROMPT))], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return pickle.loads(out.read_bytes())


class _Spec:  # tiny-llama
    num_kv_heads, head_dim, num_layers = 2, 16, 2


def _model_onnx(bundle, tokens):
    return model_onnx_run(bundle / "model.onnx", _Spec, PROMPT, tokens, native=NATIVE)


def test_per_session_two_threads_equal_model_onnx_with_unlimited_budget_and_gamma_1(tiny_dipca_bundle):
    """Decode path (token by token), teacher forced on its own greedy tokens: logits and selections
    agree with model.onnx on 1 thread."""
    out = tiny_dipca_bundle()
    eng = Engine(out, dram_budget="100%", single_session=False, fused=False, gamma=1.0, native=NATIVE, prefill="token",
                 threads=2)
    g = eng.generate(PROMPT, 6, stop_at_eos=False)
    logits, sel = eng.teacher_forced(PROMPT, g.tokens)
    ref_logits, ref_sel = _model_onnx(out, g.tokens)
    assert_runs_agree(ref_logits, ref_sel, logits, sel, len(PROMPT), Tolerance(1e-4, 1e-4))


def test_shared_two_threads_equal_model_onnx_with_unlimited_budget_and_gamma_1(tiny_dipca_bundle, shared_child):
    ref_logits, ref_sel = _model_onnx(tiny_dipca_bundle(), shared_child["tokens"])
    assert_runs_agree(ref_logits, ref_sel, shared_child["logits"], shared_child["sel"], len(PROMPT),
                      Tolerance(1e-4, 1e-4))


def _batch_first(bundle, threads):
    eng = Engine(bundle, dram_budget="50%", policy="lfu", native=NATIVE, threads=threads)
    return eng.generate(PROMPT, 1, keep_logits=True, stop_at_eos=False).logits


def test_batch_prefill_on_two_threads_agrees_with_one_thread(tiny_dipca_bundle, shared_child):
    """Batched prefill under a budget at the bundle's γ: the first token's logits agree across thread
    counts and pool modes."""
    one = _batch_first(tiny_dipca_bundle(), 1)
    for got in (_batch_first(tiny_dipca_bundle(), 2), shared_child["batch"]):
        agree = compare_logits(one, got, SPARSE)
        assert agree.ok, agree.describe()


@pytest.mark.parametrize("case,message", [("other size", "already has 2 threads"),
                                          ("per-session", "refuses per-session pools"),
                                          ("outside", "created outside dipdeploy")])
def test_shared_pool_refuses_what_onnxruntime_cannot_give_in_one_line(shared_child, case, message):
    got = shared_child[case]
    assert got is not None and message in got and "\n" not in got


def test_pool_options_per_mode():
    """One thread per-session: options untouched, no pool; per-session above 1: spinning off; shared:
    ORT's pool claimed at the size asked (a fresh record, so this process's ORT is never touched)."""
    record = GlobalPool()
    so = pool_options(session_options(1, native=False), 1, "per-session", record)
    assert so.use_per_session_threads
    with pytest.raises(RuntimeError, match="does not have configuration"):  # ORT's default left alone
        so.get_session_config_entry("session.intra_op.allow_spinning")
    so = pool_options(session_options(2, native=False), 2, "per-session", record)
    assert so.use_per_session_threads and so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert record.threads is None
    claimed = GlobalPool(threads=2)  # as if this record had created the pool: claiming again asks ORT nothing
    so = pool_options(session_options(2, native=False), 2, "shared", claimed)
    assert not so.use_per_session_threads


def test_cli_run_with_two_threads_per_session(tiny_dipca_bundle):
    res = CliRunner().invoke(app, ["run", str(tiny_dipca_bundle()), "-p", "hello", "-n", "3", "--threads", "2"])
    assert res.exit_code == 0, res.output


def test_cli_run_with_a_shared_pool(tiny_dipca_bundle, tmp_path):
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-c", "from dipdeploy.cli import app; app()", "run",
                           str(tiny_dipca_bundle()), "-p", "hello", "-n", "3", "--threads", "2",
                           "--thread-pool", "shared", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(json.loads(out.read_text())["tokens"]) == 3


def test_engine_config_refuses_bad_thread_options():
    with pytest.raises(ValueError, match="threads must be >= 1"):
        Engine("nowhere", threads=0)
    with pytest.raises(ValueError, match="thread pool global: choose one of"):
        Engine("nowhere", thread_pool="global")


def _topology(root, cpus):
    """Fake sysfs: ``cpus`` maps a CPU number to its (package, core), or None for a CPU without topology."""
    for cpu, where in cpus.items():
        topo = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
        topo.mkdir(parents=True)
        if where is not None:
            (topo / "physical_package_id").write_text(f"{where[0]}\n")
            (topo / "core_id").write_text(f"{where[1]}\n")


def test_physical_cores_count_smt_siblings_once_within_the_affinity_mask(tmp_path, monkeypatch):
    from dipdeploy.runtime.threadpool import physical_cores

    # two packages of two cores, each core with two SMT threads (CPU n and n + 4 are siblings)
    _topology(tmp_path, {n: (n // 2, n % 2) for n in range(4)} | {n + 4: (n // 2, n % 2) for n in range(4)})
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    assert physical_cores(tmp_path) == 4
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 4, 1})  # a mask with one SMT pair
    assert physical_cores(tmp_path) == 2


def test_physical_cores_fall_back_to_the_mask_without_topology(tmp_path, monkeypatch):
    from dipdeploy.runtime.threadpool import physical_cores

    _topology(tmp_path, {0: None, 1: None, 2: None})
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2})
    assert physical_cores(tmp_path) == 3


def test_the_engine_defaults_to_the_physical_cores():
    from dipdeploy.limits import MAX_THREADS
    from dipdeploy.runtime.config import EngineConfig
    from dipdeploy.runtime.threadpool import physical_cores

    assert EngineConfig().threads == min(physical_cores(), MAX_THREADS) >= 1
    assert EngineConfig(threads=1).threads == 1
