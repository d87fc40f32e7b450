"""`dipdeploy bench decode`'s rows for issue #54: DIP-CA's γ swept (`--gamma`), the peers (llama.cpp,
onnxruntime-genai) as rows of the same interleaved run (`--peer` and its paths, refused in one line when
incomplete), and the columns a limited run needs (the cgroup peak, device requests per token, `kept`).
The peer child is exercised on a fake runner and behind a mocked subprocess: no peer package is needed.
Behaviour only: no test reads a timing."""

import json
from pathlib import Path

import pytest

from dipdeploy.bench import grid as g
from dipdeploy.bench.bundles import BundleSpec
from dipdeploy.bench.rows import Sample, render, row
from dipdeploy.cli import app
from bench_helpers import one_line_refusal, runner
from test_bench import TINY, _bench, _header, _rows, _scenario
def _fake_peer_files(tmp_path):
    """An interpreter path and models the peer flags accept (nothing is started from them here)."""
    import sys

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    genai = tmp_path / "genai-int4"
    genai.mkdir()
    (genai / "genai_config.json").write_text("{}")
    return sys.executable, gguf, genai


@pytest.mark.parametrize("args, words", [
    (["--gamma", "1.5"], ["--gamma", "[0, 1]", "1.5"]),
    (["--gamma", "high"], ["--gamma", "'high'"]),
    (["--gamma", "-0.1"], ["--gamma", "[0, 1]"]),
    (["--method", "dense", "--gamma", "0.5"], ["--gamma applies to dip-ca rows"]),
    (["--peer", "vllm"], ["--peer 'vllm'", "llama.cpp, llama.cpp-no-repack, genai"]),
    (["--peer", "llama.cpp"], ["--peer llama.cpp needs --llama-python"]),
    (["--peer", "genai", "--genai-model", "{genai}"], ["--peer genai needs --genai-python"]),
    (["--peer", "llama.cpp-no-repack", "--llama-python", "{tmp}/no/python", "--gguf", "{gguf}"],
     ["--llama-python", "no such file"]),
    (["--peer", "llama.cpp", "--llama-python", "{python}", "--gguf", "{tmp}/none.gguf"], ["--gguf", "no such file"]),
    (["--peer", "llama.cpp", "--llama-python", "{python}"], ["--peer llama.cpp needs --gguf"]),
    (["--peer", "genai", "--genai-python", "{python}", "--genai-model", "{tmp}"], ["--genai-model", "genai_config.json"]),
    (["--gguf", "{gguf}"], ["--gguf is for --peer llama.cpp"]),
    (["--peer", "llama.cpp", "--genai-python", "{python}"], ["--genai-python is for --peer genai"]),
    (["--peer", ",".join(f"p{i}" for i in range(g.MAX_VALUES + 1))], ["--peer", "cap"]),
])
def test_gamma_and_peer_flags_are_refused_in_one_line_before_any_work(args, words, tmp_path, monkeypatch):
    from dipdeploy.bench import peers

    python, gguf, genai = _fake_peer_files(tmp_path)
    started = []
    monkeypatch.setattr(peers, "version", lambda *a: started.append(a) or "0")
    args = [a.format(tmp=tmp_path, python=python, gguf=gguf, genai=genai) for a in args]
    one_line_refusal(_bench("-m", "tiny-llama", *args, "--bundle-cache", str(tmp_path / "cache")), *words)
    assert not (tmp_path / "cache").exists() and not started  # no export, no interpreter started


def test_gamma_runs_each_dipca_bundle_once_per_value_and_labels_its_rows():
    from dipdeploy.bench.decode import engine_options, labels

    specs = [BundleSpec("m", "dense", 1.0, "a", policy="static"), BundleSpec("m", "dip-ca", 0.5, "b")]
    cases = g.DecodeGrid(models=["m"], gammas=g.gammas(["0.3,0.5", "1"])).cases(specs)
    assert [(c.bundle.method, c.gamma) for c in cases] == [("dense", None), ("dip-ca", 0.3), ("dip-ca", 0.5),
                                                           ("dip-ca", 1.0)]
    assert [labels(c)["method"] for c in cases] == ["dense", "dip-ca γ0.3", "dip-ca γ0.5", "dip (γ 1)"]
    assert engine_options(cases[1], 64, False)["gamma"] == 0.3 and "gamma" not in engine_options(cases[0], 64, False)
    plain = g.DecodeGrid(models=["m"]).cases(specs)  # without --gamma nothing changes
    assert [c.gamma for c in plain] == [None, None] and "gamma" not in engine_options(plain[1], 64, False)
    assert [labels(c)["method"] for c in plain] == ["dense", "dip-ca"]
    assert len({c.key() for c in cases}) == 4


def test_kept_is_a_limited_rows_speed_over_its_configuration_at_limit_none():
    from dipdeploy.bench.rows import with_kept

    labels = dict(model="m", method="dip-ca", density=0.5, budget="50%", io="direct", threads=2)
    rows = with_kept([row({**labels, "limit": "none"}, "tg4", [Sample(10.0)]),
                      row({**labels, "limit": "500MB"}, "tg4", [Sample(8.0), Sample(6.0)]),
                      row({**labels, "limit": "500MB"}, "pp8", [Sample(3.0)]),  # no pp8 at none
                      row({**labels, "threads": 1, "limit": "500MB"}, "tg4", [Sample(1.0)])])  # nor at 1 thread
    assert [r.kept for r in rows] == [None, 0.7, None, None]
    header = _header()
    md = render(rows, header, "md")
    assert "| kept |" in md and "| 0.70 |" in md
    assert "| kept |" not in render(_rows(), header, "md")  # no limited row: the old table, unchanged
    assert "cgroup peak MB" not in render(_rows(), header, "md") and "device req/tok" not in render(_rows(), header, "md")


def test_a_row_keeps_the_largest_cgroup_peak_and_the_mean_device_requests():
    labels = dict(model="m", method="dip-ca", density=0.5, budget="50%", io="direct", threads=1, limit="500MB")
    r = row(labels, "tg4", [Sample(1.0, cgroup_peak_mb=400.0, device_requests_per_token=10.0),
                            Sample(1.0, cgroup_peak_mb=450.0, device_requests_per_token=20.0)])
    assert (r.cgroup_peak_mb, r.device_requests_per_token) == (450.0, 15.0)
    md = render([r], _header(), "md")
    assert "| cgroup peak MB |" in md and "| 450.0 |" in md and "| device req/tok |" in md
    peer = row({**labels, "density": None, "budget": ""}, "tg4", [Sample(2.0)])
    assert peer.cells()[2] == "" and json.loads(render([peer], _header(), "json"))["rows"][0]["density"] is None


def _peer(tmp_path, peer="llama.cpp"):
    from dipdeploy.bench.peers import PeerSpec

    return PeerSpec(peer, "m", f"{peer} 9.9 mmap repack", tmp_path / "m.gguf", tmp_path / "python", "mmap")


def test_a_peer_child_is_its_interpreter_on_the_child_file_with_the_suites_text(tmp_path, monkeypatch):
    import subprocess

    from dipdeploy.bench import child, decode
    from dipdeploy.bench.peers import PEER_CHILD, measure_peer

    calls = []
    reply = {"status": "ok", "version": "9.9", "samples": {
        "pp8": {"tok_s": 80.0, "device_mb_per_token": 0.5, "steps": 8, "cgroup_peak_mb": 300.0},
        "tg4": {"tok_s": 20.0, "device_mb_per_token": 1.5, "steps": 3, "cgroup_peak_mb": 310.0}}}

    def run(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "loading\n" + json.dumps(reply) + "\n", "")

    monkeypatch.setattr(child.subprocess, "run", run)
    grid = g.DecodeGrid(models=["m"], n_prompt=[8], n_gen=[4], cold=True)
    case = g.Case(_peer(tmp_path), "", "mmap", 2, "500MB")
    samples, notes = measure_peer(case, grid, use_group=False)
    assert calls[0][:3] == [str(tmp_path / "python"), "-I", str(PEER_CHILD)] and PEER_CHILD.is_file()
    spec = json.loads(calls[0][3])
    assert spec["peer"] == "llama.cpp" and spec["model"] == str(tmp_path / "m.gguf") and spec["text"] == decode.PASSAGE
    assert spec["tests"] == [["pp", 8], ["tg", 4]] and spec["threads"] == 2 and spec["limit"] == 500 * 10**6
    assert spec["warmup"] == decode.WARMUP_PROMPT and spec["cold"] is True and spec["context"] >= 8
    assert samples["pp8"] == Sample(80.0, device_mb_per_token=0.5, cgroup_peak_mb=300.0)
    assert samples["tg4"].tok_s == 20.0 and notes == ["tg4 stopped after 3 of 4 steps (its t/s is over those)"]
    reply = {"status": "refused", "why": "does not fit: the group holds more after loading"}
    with pytest.raises(decode.RunFailed, match="refused: does not fit"):
        measure_peer(case, grid, use_group=False)
    reply = {"status": "ok", "samples": {"pp8": {"tok_s": 1.0}}}
    with pytest.raises(decode.RunFailed, match="holds no tg4"):
        measure_peer(case, grid, use_group=False)


class _FakeRunner:
    """A peer_child.Runner over a character tokenizer: each call recorded, no peer package needed."""

    files: list = []
    version = "0.0"

    def __init__(self, stop_at: int | None = None):
        self.calls, self.stop_at = [], stop_at

    def encode(self, text, first):
        return ([1] if first else []) + [ord(c) for c in text]

    def prefill(self, ids, start):
        start()
        self.calls.append(("prefill", len(ids)))

    def decode(self, first, n, start):
        start()
        self.calls.append(("decode", first, n))
        return n if self.stop_at is None else min(n, self.stop_at)


class _FakeGroup:
    def __init__(self, refuse=None):
        self.refuse, self.limits, self.resets = refuse, [], 0

    def set_limit(self, limit):
        self.limits.append(limit)
        return self.refuse

    def reset_peak(self):
        self.resets += 1

    def peak_mb(self):
        return 42.0


def test_the_peer_child_warms_up_sets_the_limit_then_runs_each_test():
    from dipdeploy.bench import peer_child

    spec = {"text": "abc", "tests": [["pp", 7], ["tg", 5]], "warmup": 4, "cold": False, "limit": 10**9}
    runner, group = _FakeRunner(), _FakeGroup()
    reply = peer_child.run_tests(runner, spec, group)
    assert runner.calls == [("prefill", 4), ("decode", 1, peer_child.WARMUP_GEN), ("prefill", 7), ("decode", 1, 5)]
    assert group.limits == [10**9] and group.resets == 2
    assert reply["status"] == "ok" and set(reply["samples"]) == {"pp7", "tg5"}
    assert reply["samples"]["tg5"]["steps"] == 5 and reply["samples"]["pp7"]["cgroup_peak_mb"] == 42.0
    assert all(s["tok_s"] > 0 and s["device_mb_per_token"] >= 0 for s in reply["samples"].values())
    assert peer_child.prompt_ids(runner, "abc", 9) == [1, 97, 98, 99, 97, 98, 99, 97, 98]  # one BOS, then repeats
    refused = peer_child.run_tests(_FakeRunner(), spec, _FakeGroup(refuse="does not fit"))
    assert refused == {"status": "refused", "why": "does not fit", "version": "0.0"}
    short = peer_child.run_tests(_FakeRunner(stop_at=2), {**spec, "limit": None}, None)
    assert short["samples"]["tg5"]["steps"] == 2 and short["samples"]["tg5"]["cgroup_peak_mb"] is None
    with pytest.raises(ValueError, match="tests must be"):
        peer_child.run_tests(_FakeRunner(), {**spec, "tests": [["tg", 0]]}, None)


def test_the_peer_child_imports_the_standard_library_alone_at_its_top():
    """It runs by path in the peer's venv, where dipdeploy is not installed: nothing of ours, and the peer's
    packages only inside the functions that run that peer."""
    import ast
    import sys
    from pathlib import Path

    from dipdeploy.bench import peer_child

    tree = ast.parse(Path(peer_child.__file__).read_text())
    top, anywhere = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            anywhere |= {n.split(".")[0] for n in names}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            top |= {n.split(".")[0] for n in ([a.name for a in node.names] if isinstance(node, ast.Import)
                                             else [node.module or ""])}
    assert top <= set(sys.stdlib_module_names) | {"__future__"}, top
    assert anywhere - set(sys.stdlib_module_names) - {"__future__"} == {"llama_cpp", "onnxruntime_genai", "numpy"}


def test_peers_run_as_rows_interleaved_with_ours(tiny_dipca_bundle, tmp_path, monkeypatch):
    from dipdeploy.bench import child, peers
    from dipdeploy.bench.child import ChildResult

    python, gguf, genai = _fake_peer_files(tmp_path)
    monkeypatch.setattr(peers, "version", lambda peer, py: {"llama.cpp": "0.3.36", "genai": "0.18.0"}[
        peers._SHOWN[peer]])
    specs = []

    def run_child(argv, spec, limit, use_group, env=None):
        specs.append(spec)
        s = {"tok_s": 5.0, "device_mb_per_token": 0.0, "steps": 4, "cgroup_peak_mb": None}
        return ChildResult("ok", reply={"status": "ok", "samples": {"pp8": s, "tg4": s}})

    monkeypatch.setattr(child, "run_child", run_child)
    res = _bench("-m", str(tiny_dipca_bundle()), *TINY, "-r", "2", "--io", "mmap", "--gamma", "0.5,1",
                 "--peer", "llama.cpp,genai", "--llama-python", python, "--gguf", str(gguf),
                 "--genai-python", python, "--genai-model", str(genai), "-o", "json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [(r["method"], r["test"]) for r in out["rows"]] == [
        ("dip-ca γ0.5", "pp8"), ("dip-ca γ0.5", "tg4"), ("dip (γ 1)", "pp8"), ("dip (γ 1)", "tg4"),
        ("llama.cpp 0.3.36 mmap repack", "pp8"), ("llama.cpp 0.3.36 mmap repack", "tg4"),
        ("genai 0.18.0 read at load", "pp8"), ("genai 0.18.0 read at load", "tg4")]
    peer_rows = out["rows"][4:]
    assert all(r["density"] is None and r["repetitions"] == 2 and r["model"] in ("m", "genai-int4")
               for r in peer_rows)
    progress = [line.split(": ")[1] for line in res.stderr.splitlines() if line.startswith("[")]
    assert len(progress) == 8 and "llama.cpp" in progress[2] and "genai" in progress[3] and "γ" in progress[4]
    assert [s["peer"] for s in specs] == ["llama.cpp", "genai"] * 2
    command = out["header"]["command"]
    assert "--gamma 0.5,1" in command and "--peer llama.cpp,genai" in command and f"--gguf {gguf}" in command


def test_the_issue_54_scenario_holds_the_peers_and_the_gamma_sweep(tmp_path):
    from pathlib import Path

    from dipdeploy.bench.scenario import load

    sc = load(Path(__file__).resolve().parents[1] / "benchmarks" / "scenarios" / "decode-qwen2.5-coder-1.5b.toml")
    assert sc.suite == "decode" and sc.value("peer", None) == ["llama.cpp", "llama.cpp-no-repack", "genai"]
    assert sc.value("gamma", None) == ["0.3", "0.5", "0.7", "1"] and sc.value("limit", None) == ["559MB"]
    assert sc.value("budget", None) == ["340MB"] and sc.published == "benchmarks/results/runtime-qwen2.5-coder-1.5b.md"
    assert isinstance(sc.value("llama_python", None), str) and sc.value("llama_python", Path("x")) == Path("x")
    one_line_refusal(runner.invoke(app, ["bench", "decode", "--scenario", str(_scenario(
        tmp_path, 'suite = "decode"\n[flags]\ngguf = ["a", "b"]\n'))]), "flags.gguf", "string")


def test_our_engine_and_the_peers_reserve_the_same_context():
    """A limit weighs on every engine alike: ours reserves the KV cache of the tests' positions, as the
    peers are given (not the engine's larger default)."""
    from dipdeploy.bench.decode import engine_options, needed_context
    from dipdeploy.bench.peers import child_spec

    grid = g.DecodeGrid(models=["m"], n_prompt=[128], n_gen=[32])
    case = grid.cases([BundleSpec("m", "dip-ca", 0.5, "b")])[0]
    need = needed_context(grid)
    assert need == 128 and engine_options(case, need, False)["context"] == need
    from dipdeploy.bench.peers import PeerSpec

    peer = PeerSpec("llama.cpp", "m", "llama.cpp 0 mmap repack", Path("m.gguf"), "python", "mmap")
    assert child_spec(peer, grid.tests(), need, 2, False, None)["context"] == need


def test_accuracy_levels_run_each_of_our_configurations_once_per_level_and_label_them():
    from dipdeploy.bench.decode import engine_options, labels

    specs = [BundleSpec("m", "dense", 1.0, "a", policy="static"), BundleSpec("m", "dip-ca", 0.5, "b")]
    cases = g.DecodeGrid(models=["m"], gammas=[0.5], accuracy_levels=g.accuracy_levels(["0,4"])).cases(specs)
    assert [(c.bundle.method, c.gamma, c.accuracy_level) for c in cases] == [
        ("dense", None, 0), ("dense", None, 4), ("dip-ca", 0.5, 0), ("dip-ca", 0.5, 4)]
    assert [labels(c)["method"] for c in cases] == ["dense L0", "dense L4", "dip-ca γ0.5 L0", "dip-ca γ0.5 L4"]
    assert engine_options(cases[1], 64, False)["accuracy_level"] == 4
    assert "accuracy_level" not in engine_options(g.DecodeGrid(models=["m"]).cases(specs)[0], 64, False)
    assert len({c.key() for c in cases}) == 4
    for bad in ("2", "x", "4,,0"):
        with pytest.raises(ValueError, match="--accuracy-level"):
            g.accuracy_levels([bad])
