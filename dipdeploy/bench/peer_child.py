"""The child half of a peer's benchmark row: llama-bench's pp and tg tests run by another engine
(llama.cpp through llama-cpp-python, onnxruntime-genai), inside the cgroup memory group its parent made.

Why a module of the standard library alone: each peer lives in a virtual environment of its own (genai
pins its own onnxruntime; llama-cpp-python is built from source for the CPU), where dipdeploy is not
installed. The parent (``dipdeploy.bench.peers``) starts it by path with the peer's interpreter in
isolated mode, so this folder's modules never shadow the peer's imports::

    PEER_PYTHON -I dipdeploy/bench/peer_child.py SPEC_JSON

The spec: ``peer`` (one of ``PEERS``), ``model`` (a GGUF file, or genai's model folder), ``text`` (the
passage every prompt is cut from: the decode suite's, so the peer's rows read what ours read, tokenized
by the peer's own tokenizer), ``tests`` ([["pp", N], ["tg", N]]), ``warmup`` (the warm-up prompt's
tokens), ``context`` (positions the longest test needs), ``threads``, ``cold``, ``limit`` (bytes or
null) and ``group`` ({"path", "version"} of the group the child runs in, or null). ``{"probe": true,
"peer": ...}`` only imports the peer's package and replies its version.

The run, in the decode suite's order: the model's files are dropped from the page cache (cgroup v1
charges a page to the group that first reads it: pages cached before would escape the limit), the model
loads, a warm-up (a short prompt and two generated tokens) runs unmeasured, and then the limit is set:
after the load, because a peer has no budget to refuse with and the kernel's refusal to reach the limit
(the peer's own memory cannot be reclaimed below it) is the peer's answer, a ``refused`` reply with the
reason, where a limit set before the load would kill the loader without one. Each test then starts from
an empty KV cache (``cold``: the files dropped again first) with the group's peak reset (cgroup v1; v2
keeps the peak since the group began):

* ``ppN``: the prefill of the first N prompt tokens; tokens/s is N over its wall time.
* ``tgN``: the first prompt token, its greedy token, then N decode steps, each feeding the token the last
  picked (greedy, end-of-sequence ignored: llama.cpp is fed on; genai, which stops at it, is kept from
  picking it by ``min_length`` and the reply counts the steps it made); tokens/s is the steps over their
  wall time.

Device MB per token is ``/proc/self/io``'s ``read_bytes`` over the test's steps (what the block layer read
for this process, page faults of a mapped file included). The reply is one JSON line.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Callable

#: the peers, as ``--peer`` names them: llama.cpp as it loads by default (its CPU backend repacks Q4_0
#: weights into anonymous memory, a copy the kernel cannot reclaim) and with the repacking off (the weights
#: used from the mapped file's pages, llama.cpp's ``--no-repack``), and onnxruntime-genai
PEERS = ("llama.cpp", "llama.cpp-no-repack", "genai")
#: each peer's package, whose ``__version__`` the row names
PACKAGES = {"llama.cpp": "llama_cpp", "llama.cpp-no-repack": "llama_cpp", "genai": "onnxruntime_genai"}
#: how each peer holds its weights (the row's load mode)
LOAD_MODES = {"llama.cpp": "mmap repack", "llama.cpp-no-repack": "mmap no-repack", "genai": "read at load"}
#: bounds on what a spec asks (the parent's grid bounds are lower; these stop a hand-written spec)
MAX_TOKENS = 1 << 16
MAX_TESTS = 64
#: tokens the warm-up generates after its prompt, as the decode suite's
WARMUP_GEN = 2
_MB = 1e6

Start = Callable[[], None]


def read_bytes() -> int:
    """Bytes the block layer read for this process so far (``/proc/self/io``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def drop_files(paths: list[Path]) -> None:
    """Forget the files' unmapped cached pages (mapped ones leave only under the limit's reclaim)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class Group:
    """The cgroup memory group the child runs in: its limit set from inside, its peak reset and read."""

    def __init__(self, path: str | Path, version: int):
        self.path, self.version = Path(path), int(version)

    def _write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def _read(self, name: str) -> str | None:
        try:
            return (self.path / name).read_text().strip()
        except OSError:
            return None

    def set_limit(self, limit: int | None) -> str | None:
        """Limit the group to ``limit`` bytes (None: no limit); the reason when the kernel cannot reach it
        (v1 answers EBUSY: the group's charge cannot be reclaimed below it)."""
        if limit is None:
            return None
        try:
            self._write("memory.limit_in_bytes" if self.version == 1 else "memory.max", str(limit))
        except OSError as err:
            if err.errno != errno.EBUSY:
                raise
            usage = self._read("memory.usage_in_bytes" if self.version == 1 else "memory.current") or "0"
            held = int(usage) / _MB if usage.isdigit() else 0.0
            return (f"does not fit: the group holds {held:.0f} MB after loading and the kernel cannot reclaim it "
                    f"below the {limit / _MB:.4g} MB limit")
        return None

    def reset_peak(self) -> None:
        """Start the peak afresh (cgroup v1 only: v2's ``memory.peak`` resets per open file, not here)."""
        if self.version == 1:
            self._write("memory.max_usage_in_bytes", "0")

    def peak_mb(self) -> float | None:
        value = self._read("memory.max_usage_in_bytes" if self.version == 1 else "memory.peak")
        return int(value) / _MB if value and value.isdigit() else None


class Runner:
    """One loaded peer: its files, its tokenizer and the two tests' work. ``prefill`` and ``decode`` start
    from an empty KV cache and call ``start`` where the timed part begins."""

    files: list[Path]
    version: str

    def encode(self, text: str, first: bool) -> list[int]:
        """The text's tokens; ``first``: with the tokenizer's leading special tokens (a BOS)."""
        raise NotImplementedError

    def prefill(self, ids: list[int], start: Start) -> None:
        raise NotImplementedError

    def decode(self, first: int, n: int, start: Start) -> int:
        """Feed ``first``, pick its token, ``start()``, then up to ``n`` steps; the steps made."""
        raise NotImplementedError


def model_files(spec: dict) -> list[Path]:
    """The files a peer reads its weights from: the GGUF, or genai's ONNX graph and its external data."""
    if spec["peer"] == "genai":
        return sorted(p for p in Path(spec["model"]).glob("*.onnx*") if p.is_file())
    return [Path(spec["model"])]


class LlamaRunner(Runner):
    def __init__(self, spec: dict):
        import llama_cpp
        import numpy as np
        from llama_cpp import Llama

        if spec["peer"] == "llama.cpp-no-repack":  # Llama() takes its model parameters from this function
            defaults = llama_cpp.llama_cpp.llama_model_default_params

            def no_repack():
                params = defaults()
                params.use_extra_bufts = False
                return params

            llama_cpp.llama_cpp.llama_model_default_params = no_repack
        t = spec["threads"]
        self.llm = Llama(spec["model"], n_ctx=spec["context"], n_threads=t, n_threads_batch=t, use_mmap=True,
                         verbose=False)
        self.files, self.version = [Path(spec["model"])], llama_cpp.__version__
        vocab, logits_of = self.llm.n_vocab(), llama_cpp.llama_get_logits_ith

        def pick() -> int:  # greedy: the last position's largest logit
            return int(np.argmax(np.ctypeslib.as_array(logits_of(self.llm.ctx, -1), shape=(vocab,))))

        self.pick = pick

    def encode(self, text: str, first: bool) -> list[int]:
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=first, special=False))

    def prefill(self, ids: list[int], start: Start) -> None:
        self.llm.reset()
        start()
        self.llm.eval(ids)

    def decode(self, first: int, n: int, start: Start) -> int:
        self.llm.reset()
        self.llm.eval([first])
        token = self.pick()
        start()
        for _ in range(n):  # end-of-sequence is fed on like any token
            self.llm.eval([token])
            token = self.pick()
        return n


class GenaiRunner(Runner):
    def __init__(self, spec: dict):
        import numpy as np
        import onnxruntime_genai as og

        config = og.Config(spec["model"])
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": spec["threads"], "inter_op_num_threads": 1}}}}))
        self.og, self.np = og, np
        self.model = og.Model(config)
        self.tokenizer = og.Tokenizer(self.model)
        self.files, self.version = model_files(spec), og.__version__

    def encode(self, text: str, first: bool) -> list[int]:
        ids = [int(i) for i in self.tokenizer.encode(text)]
        if first:
            return ids
        try:  # what the tokenizer adds to any text (a BOS)
            lead = [int(i) for i in self.tokenizer.encode("")]
        except Exception:  # a tokenizer that refuses empty text adds nothing we can see
            lead = []
        return ids[len(lead):] if lead and ids[:len(lead)] == lead else ids

    def _generator(self, length: int):
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(do_sample=False, max_length=length)
        try:  # end-of-sequence kept from being picked before the last step
            params.set_search_options(min_length=length)
        except Exception:  # an older genai without min_length: the reply's steps say where it stopped
            pass
        return self.og.Generator(self.model, params)

    def prefill(self, ids: list[int], start: Start) -> None:
        gen = self._generator(len(ids) + 1)
        start()
        gen.append_tokens(self.np.asarray(ids, dtype=self.np.int32))

    def decode(self, first: int, n: int, start: Start) -> int:
        gen = self._generator(n + 2)
        gen.append_tokens(self.np.asarray([first], dtype=self.np.int32))
        gen.generate_next_token()  # the first token: the prompt's logits, computed by append_tokens
        start()
        steps = 0
        while steps < n and not gen.is_done():
            gen.generate_next_token()
            steps += 1
        return steps


def prompt_ids(runner: Runner, text: str, n: int) -> list[int]:
    """``n`` tokens of ``text`` repeated (its first encoding keeps the tokenizer's leading special tokens,
    the repeats are the text's tokens alone), as the decode suite cuts its prompts."""
    ids = runner.encode(text, first=True)
    again = runner.encode(text, first=False) or ids
    if not ids:
        raise ValueError("the peer's tokenizer gives no token for the prompt's text")
    while len(ids) < n:
        ids += again
    return ids[:n]


def timed(work: Callable[[Start], int]) -> tuple[int, float, int]:
    """(steps, seconds, device bytes) of ``work(start)``, from its ``start()`` to its return."""
    mark: list[float] = []

    def start() -> None:
        mark[:] = [time.perf_counter(), float(read_bytes())]

    steps = work(start)
    if not mark:
        raise RuntimeError("the peer's test never started its timer")
    return steps, time.perf_counter() - mark[0], read_bytes() - int(mark[1])


def _test(runner: Runner, kind: str, n: int, ids: list[int]) -> Callable[[Start], int]:
    """The work of one test, for :func:`timed`: a prefill of ``n`` prompt tokens, or ``n`` decode steps."""
    def work(start: Start) -> int:
        if kind == "pp":
            runner.prefill(ids[:n], start)
            return n
        return runner.decode(ids[0], n, start)

    return work


def run_tests(runner: Runner, spec: dict, group: Group | None) -> dict:
    """The warm-up, the limit, then every test (the module docstring); the reply."""
    tests = [(str(kind), int(n)) for kind, n in spec["tests"]]
    if not tests or len(tests) > MAX_TESTS or any(kind not in ("pp", "tg") or not 0 < n <= MAX_TOKENS
                                                  for kind, n in tests):
        raise ValueError(f"tests must be 1 to {MAX_TESTS} of pp N or tg N, N in [1, {MAX_TOKENS}]: {tests}")
    longest = max([n for kind, n in tests if kind == "pp"] + [1])
    ids = prompt_ids(runner, spec["text"], max(longest, spec["warmup"]))
    runner.prefill(ids[:spec["warmup"]], lambda: None)
    runner.decode(ids[0], WARMUP_GEN, lambda: None)
    if spec["cold"]:
        drop_files(runner.files)
    if spec.get("limit") is not None:
        if group is None:
            return {"status": "failed", "why": "a limit needs a group, and the child was given none"}
        refused = group.set_limit(int(spec["limit"]))
        if refused:
            return {"status": "refused", "why": refused, "version": runner.version}
    samples = {}
    for kind, n in tests:
        if spec["cold"]:
            drop_files(runner.files)
        if group is not None:
            group.reset_peak()
        steps, seconds, device = timed(_test(runner, kind, n, ids))
        samples[f"{kind}{n}"] = {"tok_s": steps / seconds if seconds > 0 and steps else 0.0,
                                 "device_mb_per_token": device / max(steps, 1) / _MB, "steps": steps,
                                 "cgroup_peak_mb": group.peak_mb() if group is not None else None}
    return {"status": "ok", "version": runner.version, "samples": samples}


RUNNERS: dict[str, Callable[[dict], Runner]] = {"llama.cpp": LlamaRunner, "llama.cpp-no-repack": LlamaRunner,
                                                "genai": GenaiRunner}


def run(spec: dict) -> dict:
    """One repetition of the peer: the files dropped, the model loaded, the tests run."""
    if spec.get("peer") not in PEERS:
        raise ValueError(f"peer {spec.get('peer')!r} is not one of {', '.join(PEERS)}")
    if spec.get("probe"):
        return {"status": "ok", "version": __import__(PACKAGES[spec["peer"]]).__version__}
    group = Group(spec["group"]["path"], spec["group"]["version"]) if spec.get("group") else None
    drop_files(model_files(spec))  # cold, and the pages the load reads are charged to this group
    reply = run_tests(RUNNERS[spec["peer"]](spec), spec, group)
    reply["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / _MB  # KiB on Linux
    return reply


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: PEER_PYTHON -I peer_child.py SPEC_JSON (started by dipdeploy bench decode --peer)",
              file=sys.stderr)
        return 2
    print(json.dumps(run(json.loads(argv[1]))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
