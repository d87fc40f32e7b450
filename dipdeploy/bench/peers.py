"""The peers as rows of the decode suite: llama.cpp and onnxruntime-genai run the same pp and tg tests as
our configurations, in the same interleaved run, under the same threads, limits and repetitions.

Why rows of the same run: a comparison made by two tools on two days mixes the machine's drift into the
ratio; here every peer's repetition sits between ours (``grid.order``). Each peer runs in a child process
started with its own virtual environment's interpreter (``--llama-python``, ``--genai-python``): the child
(``dipdeploy.bench.peer_child``) imports the standard library and the peer's package alone, and reports
each test's tokens/s, device MB per token and the group's peak. This half checks the flags before any
work (each peer needs its interpreter and its model, and a file that is not there is refused in one line
naming the flag), asks each interpreter once for its package's version, which goes into the row's method
with the peer's load mode (``llama.cpp 0.3.36 mmap repack``), and turns a child's reply into samples.

llama.cpp's model is ``--gguf``; without it, the GGUF a registry model ships as (``-m`` a registry name,
or a bundle exported from one) where it already lies in the cache as one file (a chunked source is
joined by its first load, never here). genai's is ``--genai-model``, a folder its own builder wrote
(``benchmarks/peers.py``: ``build_genai``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dipdeploy.bench.peer_child import LOAD_MODES, PEERS

#: the child, run by path: the peer's venv has no dipdeploy to import it from
PEER_CHILD = Path(__file__).resolve().with_name("peer_child.py")
#: each peer's interpreter flag, model flag, and the name its rows carry
PYTHON_FLAG = {"llama.cpp": "--llama-python", "llama.cpp-no-repack": "--llama-python", "genai": "--genai-python"}
MODEL_FLAG = {"llama.cpp": "--gguf", "llama.cpp-no-repack": "--gguf", "genai": "--genai-model"}
_SHOWN = {"llama.cpp": "llama.cpp", "llama.cpp-no-repack": "llama.cpp", "genai": "genai"}
_IO = {"llama.cpp": "mmap", "llama.cpp-no-repack": "mmap", "genai": "read at load"}
#: seconds an interpreter may take to import its peer's package and say its version
PROBE_TIMEOUT = 300


@dataclass(frozen=True)
class PeerSpec:
    """One peer a row runs: ``peer`` (a ``PEERS`` name), the row's labels (``model``: the model file's or
    folder's name; ``method``: the peer, its version and load mode), the model at ``path``, the peer's
    interpreter ``python`` and how it reads its weights (``io``). No density: a peer runs its model whole."""

    peer: str
    model: str
    method: str
    path: Path
    python: Path
    io: str
    density: None = None


@dataclass(frozen=True)
class PeerFlags:
    """The peer flags as given: the peers (``--peer``) and the paths each needs, None where not given."""

    peers: tuple[str, ...] = ()
    gguf: Path | None = None
    genai_model: Path | None = None
    llama_python: Path | None = None
    genai_python: Path | None = None

    def of(self, flag: str) -> Path | None:
        return {"--gguf": self.gguf, "--genai-model": self.genai_model, "--llama-python": self.llama_python,
                "--genai-python": self.genai_python}[flag]


def registry_gguf(models: list[str]) -> Path | None:
    """The one GGUF the ``-m`` values' registry models ship as, where it already lies in the cache or in
    an installed package as one file; None when there is none, or more than one."""
    from dipdeploy.bench.bundles import is_bundle
    from dipdeploy.registry import get_model, is_registered

    found: list[Path] = []
    for target in models:
        name = target
        if is_bundle(target):
            from dipdeploy.bundle.manifest import read_manifest

            name = str((read_manifest(Path(target)).source or {}).get("model"))
        if not is_registered(name):
            continue
        path = _cached_gguf(get_model(name).source or {})
        if path is not None and path not in found:
            found.append(path)
    return found[0] if len(found) == 1 else None


def _cached_gguf(src: dict) -> Path | None:
    """A registry source's GGUF where it needs no join: the joined parts in the cache (the size checked, as
    ``wheelparts.joined`` trusts it), or the file inside an installed package of one file."""
    if not src.get("gguf"):
        return None
    if "parts" in src:
        from dipdeploy.paths import cache_dir

        path = cache_dir("gguf", src["gguf"])
        return path if path.is_file() and path.stat().st_size == src.get("size") else None
    if src.get("chunks") or not src.get("module"):
        return None
    import importlib.util

    found = importlib.util.find_spec(src["module"])
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(list(found.submodule_search_locations)[0]) / src["gguf"]
    return path if path.is_file() else None


def check(flags: PeerFlags, models: list[str]) -> dict[str, tuple[Path, Path]]:
    """Each peer's (model, interpreter), every flag checked without starting anything: a peer without its
    interpreter or model, a path that is not there, or a peer flag with no peer that takes it, is refused
    in one line naming the flag."""
    for flag in ("--gguf", "--genai-model", "--llama-python", "--genai-python"):
        users = [p for p in PEERS if flag in (PYTHON_FLAG[p], MODEL_FLAG[p])]
        if flags.of(flag) is not None and not set(users) & set(flags.peers):
            raise ValueError(f"{flag} is for --peer {' or '.join(users)}, and none is asked; give --peer "
                             f"{users[0]} or leave {flag} out")
    out = {}
    for peer in flags.peers:
        py_flag, model_flag = PYTHON_FLAG[peer], MODEL_FLAG[peer]
        python = flags.of(py_flag)
        if python is None:
            raise ValueError(f"--peer {peer} needs {py_flag} PYTHON: the interpreter of the virtual environment "
                             f"its package is installed in (benchmarks/peers.py says how to build it)")
        python = python.expanduser()
        if not python.is_file():
            raise ValueError(f"{py_flag} {python}: no such file; give the peer's venv interpreter (VENV/bin/python)")
        model = flags.of(model_flag)
        if model is None and model_flag == "--gguf":
            model = registry_gguf(models)
        if model is None:
            what = ("a GGUF file (the -m models name none already in the cache)" if model_flag == "--gguf"
                    else "the folder onnxruntime-genai's builder wrote")
            raise ValueError(f"--peer {peer} needs {model_flag}: {what}")
        model = model.expanduser()
        if model_flag == "--gguf" and not model.is_file():
            raise ValueError(f"--gguf {model}: no such file; give llama.cpp's model, a .gguf file")
        if model_flag == "--genai-model" and not (model / "genai_config.json").is_file():
            raise ValueError(f"--genai-model {model} holds no genai_config.json; give the folder "
                             f"onnxruntime-genai's builder wrote")
        out[peer] = (model, python)
    return out


def child_argv(python: Path | str) -> list[str]:
    """The child's command before its spec: the peer's interpreter, isolated (no script folder or user
    site on its path, so this folder's modules never shadow the peer's), on the child's file."""
    return [str(python), "-I", str(PEER_CHILD)]


def version(peer: str, python: Path) -> str:
    """The peer package's version, asked of its interpreter: also the check that it imports there."""
    from dipdeploy.bench.child import run_child

    done = run_child(child_argv(python), {"peer": peer, "probe": True}, None, use_group=False, timeout=PROBE_TIMEOUT)
    if done.status != "ok" or not done.reply or not isinstance(done.reply.get("version"), str):
        raise ValueError(f"{PYTHON_FLAG[peer]} {python} cannot run the {peer} peer ({done.why or 'no version'}); "
                         f"give the interpreter of the venv its package is installed in")
    return done.reply["version"]


def resolve(flags: PeerFlags, models: list[str]) -> list[PeerSpec]:
    """The peers' specs, in ``--peer`` order: the flags checked first, then each interpreter asked once."""
    paths = check(flags, models)
    versions: dict[tuple[str, Path], str] = {}
    out = []
    for peer, (model, python) in paths.items():
        package = _SHOWN[peer]
        if (package, python) not in versions:
            versions[package, python] = version(peer, python)
        label = f"{package} {versions[package, python]} {LOAD_MODES[peer]}"
        out.append(PeerSpec(peer, model.stem if model.is_file() else model.name, label, model, python, _IO[peer]))
    return out


def child_spec(peer: PeerSpec, tests: list[tuple[str, int]], context: int, threads: int, cold: bool,
               limit: int | None) -> dict:
    """The child's spec (``dipdeploy.bench.peer_child``): the decode suite's text and warm-up, so the peer's
    prompts are cut from what ours read."""
    from dipdeploy.bench.decode import PASSAGE, WARMUP_PROMPT

    return {"peer": peer.peer, "model": str(peer.path), "text": PASSAGE, "tests": [list(t) for t in tests],
            "warmup": WARMUP_PROMPT, "context": context, "threads": threads, "cold": cold, "limit": limit}


def parse_reply(reply: dict, tests: list[tuple[str, int]]):
    """A child's ``ok`` reply as ``({test: Sample}, notes)``; a test missing from it is a failed run. A tg
    test that stopped before its N steps keeps its figures (tokens/s over the steps made) and says so."""
    from dipdeploy.bench.decode import RunFailed
    from dipdeploy.bench.rows import Sample

    samples, notes, got = {}, [], reply.get("samples") or {}
    for kind, n in tests:
        name = f"{kind}{n}"
        if not isinstance(got.get(name), dict) or not isinstance(got[name].get("tok_s"), (int, float)):
            raise RunFailed("failed", f"the peer's reply holds no {name}")
        s = got[name]
        samples[name] = Sample(tok_s=float(s["tok_s"]), device_mb_per_token=s.get("device_mb_per_token"),
                               cgroup_peak_mb=s.get("cgroup_peak_mb"))
        if kind == "tg" and int(s.get("steps", n)) < n:
            notes.append(f"{name} stopped after {s['steps']} of {n} steps (its t/s is over those)")
    return samples, notes


def measure_peer(case, grid, use_group: bool):
    """One repetition of a peer's tests: its child, in a fresh group when ``use_group`` (the child sets the
    case's limit itself, after its load and warm-up); ``({test: Sample}, notes)``, or RunFailed."""
    from dipdeploy.bench.child import run_child
    from dipdeploy.bench.decode import RunFailed, needed_context
    from dipdeploy.bench.grid import parse_limit

    peer: PeerSpec = case.bundle
    spec = child_spec(peer, grid.tests(), needed_context(grid), case.threads, grid.cold, parse_limit(case.limit))
    done = run_child(child_argv(peer.python), spec, None, use_group)
    if done.status != "ok":
        raise RunFailed(done.status, done.why)
    return parse_reply(done.reply, grid.tests())


def flag_words(peers: list[PeerSpec]) -> list[str]:
    """The command-line words that give ``peers`` again (``bench``'s rerun line)."""
    if not peers:
        return []
    words = ["--peer", ",".join(p.peer for p in peers)]
    for flag in ("--gguf", "--genai-model"):
        model = next((p.path for p in peers if MODEL_FLAG[p.peer] == flag), None)
        words += [flag, str(model)] if model else []
    for flag in ("--llama-python", "--genai-python"):
        python = next((p.python for p in peers if PYTHON_FLAG[p.peer] == flag), None)
        words += [flag, str(python)] if python else []
    return words
