"""A benchmark run in a process of its own: the child's entry (``python -m dipdeploy.bench.child SPEC``)
and the parent's call of it (:func:`spawn`; :func:`run_child` starts any child of this protocol, a peer's
too: ``dipdeploy.bench.peer_child``), one protocol in one module.

Why a process: its peak resident memory (``VmHWM``) and its cgroup's peak are the run's alone, not the
parent's imports or an earlier run's freed pages, and a cgroup limit applies to it alone. Before each
run the bundle's files are dropped from the page cache (cgroup v1 charges a page to the group that first
reads it, so pages the parent cached would escape the limit). The spec is JSON: the ``suite``, the
bundle, the engine's options, and the suite's work:

* ``memory``: feed ``n_prompt`` tokens (one when 0) and generate ``n_gen`` + 1 greedily, end-of-sequence
  ignored; the reply holds the planned residency, ``/proc/self/status`` after the imports, after the
  engine opened and at the end, and the run's tokens/s.
* ``decode``: the decode suite's tests (``dipdeploy.bench.decode.run_tests``); the reply holds each test's
  sample, with the group's peak over the test (the spec names the group when there is one).

The child prints one JSON line. An option the engine refuses (a budget that cannot fit under the group's
limit, ``check_budget``) is a ``refused`` reply, not a failure; a kill by the limit leaves no reply, and
the parent reads the exit status and the group's OOM count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

#: a run that has not ended by then is stuck (a thrashing page cache under a tight limit), not slow
CHILD_TIMEOUT = 3600
#: what a child's reply may say of its run
STATUSES = ("ok", "refused", "failed")


@dataclass(frozen=True)
class ChildResult:
    """``status``: ok, refused, killed or failed; ``why``: the engine's refusal or the child's last line;
    ``reply``: the child's JSON (None when it printed none); the group's peak and limit hits (None
    without a group)."""

    status: str
    why: str = ""
    reply: dict | None = None
    cgroup_peak: int | None = None
    limit_hits: int | None = None


def drop_page_cache(bundle: Path) -> None:
    """Every file of the bundle out of the page cache (clean pages only; a file that cannot be opened is
    left as it is)."""
    for path in Path(bundle).iterdir():
        if path.is_file():
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _env() -> dict:
    """The child imports this dipdeploy, wherever it was imported from (a checkout on PYTHONPATH)."""
    here = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": here + (os.pathsep + path if path else "")}


def spawn(spec: dict, limit: int | None, use_group: bool) -> ChildResult:
    """Run ``spec`` in a child of this dipdeploy, in a fresh cgroup memory group limited to ``limit`` when
    ``use_group``, the bundle's files dropped from the page cache first."""
    drop_page_cache(Path(spec["bundle"]))
    return run_child([sys.executable, "-m", "dipdeploy.bench.child"], spec, limit, use_group, _env())


def last_line(stderr: str) -> str:
    """A failed child's last line of stderr, whole: its exception's message (the figures and the fix the
    engine's one-line refusals give), never a slice that starts inside it."""
    return (stderr.strip().splitlines() or ["no output"])[-1].strip()


def run_child(argv: list[str], spec: dict, limit: int | None, use_group: bool, env: dict | None = None,
              timeout: int = CHILD_TIMEOUT) -> ChildResult:
    """``argv`` and ``spec`` as its last argument (JSON), in a fresh cgroup memory group limited to ``limit``
    when ``use_group`` (the spec then names the group, ``{"path", "version"}``, so the child can read its
    peak or set a limit of its own); the child's one-line JSON reply, or why there is none."""
    from dipdeploy.bench.cgroup import memory_group

    peak = hits = kills = None
    try:
        if use_group:
            with memory_group("dipdeploy-bench", limit) as group:
                cmd = [*argv, json.dumps({**spec, "group": {"path": str(group.path), "version": group.version}})]
                try:
                    done = subprocess.run(cmd, capture_output=True, text=True, env=env, preexec_fn=group.enter,
                                          timeout=timeout)
                finally:
                    peak, hits, kills = group.peak(), group.limit_hits(), group.oom_kills()
        else:
            done = subprocess.run([*argv, json.dumps(spec)], capture_output=True, text=True, env=env,
                                  timeout=timeout)
    except subprocess.TimeoutExpired:  # run() killed it
        return ChildResult("failed", f"did not end within {timeout} s", None, peak, hits)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = last_line(done.stderr)
        status = "killed" if done.returncode < 0 or kills else "failed"
        return ChildResult(status, f"exit {done.returncode}: {last}", None, peak, hits)
    try:
        reply = json.loads(lines[-1])
    except ValueError:
        return ChildResult("failed", f"no reply (its last line: {lines[-1][:200]})", None, peak, hits)
    if not isinstance(reply, dict) or reply.get("status") not in STATUSES:
        return ChildResult("failed", f"a reply without a known status: {lines[-1][:200]}", None, peak, hits)
    return ChildResult(reply["status"], reply.get("why", ""), reply, peak, hits)


def _memory(spec: dict, engine, imports: dict) -> dict:
    from dipdeploy.bench.decode import prompt_ids
    from dipdeploy.runtime.sampler import Sampler
    from dipdeploy.runtime.stats import memory_now

    opened = memory_now()
    ids = prompt_ids(engine, max(spec["n_prompt"], 1))
    g = engine.generate(ids, spec["n_gen"] + 1, sampler=Sampler(temperature=0.0), stop_at_eos=False)
    return {"status": "ok", "planned": engine.residency.total, "imports": imports, "opened": opened,
            "end": memory_now(), "prefill_tok_s": g.stats.prefill_tok_s, "decode_tok_s": g.stats.decode_tok_s,
            "io": g.stats.io}


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    from dipdeploy.runtime.stats import memory_now

    imports = memory_now()
    from dipdeploy.bench.decode import open_engine, run_tests

    try:
        engine = open_engine(spec["bundle"], spec["options"])
        if spec["suite"] == "decode":
            from dipdeploy.bench.peer_child import Group

            group = Group(spec["group"]["path"], spec["group"]["version"]) if spec.get("group") else None
            samples = run_tests(engine, [tuple(t) for t in spec["tests"]], spec["need"], group)
            reply = {"status": "ok", "samples": {test: asdict(s) for test, s in samples.items()}}
        else:
            reply = _memory(spec, engine, imports)
    except ValueError as err:  # the budget does not fit under the limit, or a bad option: said, not crashed
        reply = {"status": "refused", "why": " ".join(str(err).split())}
    print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
