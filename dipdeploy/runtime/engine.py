"""The host engine: a bundle under a DRAM budget, MLP rows streamed from Flash.

``Engine`` opens the bundle (``bundle_open``: its checks; every file read through one held folder,
``dipdeploy.bundle.bundledir``, under the folder's reading lock so an export's swap waits), resolves what ``EngineConfig`` leaves open
(context, io, native kernels), refuses a budget the cgroup limit or ``ulimit -v`` cannot hold, chooses one decoder (``dipdeploy.runtime.
backends``: ``model.onnx`` in one session where the budget holds every row, else the joined graph, else
the per-layer sessions with the host cache step) and generates: prefill, sampling, stop strings, stats.
The KV cache is allocated once for the context and written in place (``kv.py``); the cache rule, the
DIP-CA score and the slot rule are ``dipdeploy.cache`` (one definition, shared with the torch reference
and the simulator). Traces, Belady's recording pass and teacher forcing are ``dipdeploy.runtime.record``.
Torch-free (floor 5).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from dipdeploy.bundle.bundledir import BundleDir
from dipdeploy.bundle.manifest import REGENERATE, BundleError, held, restore_interrupted
from dipdeploy.bundle.names import GENAI_CONFIG, MLP_FILE, TOKENIZER
from dipdeploy.cache import policy_of
from dipdeploy.runtime import record as recording
from dipdeploy.runtime.backends import Decoder, choose_backend, open_backend
from dipdeploy.runtime.bundle_open import bundle_positions, check_vocabulary, open_bundle, read_json
from dipdeploy.runtime.budget import DEFAULT_CONTEXT
from dipdeploy.runtime.cgroup import check_budget, memory_limit
from dipdeploy.runtime.config import EngineConfig
from dipdeploy.runtime.embedding import check_token_ids, embedding_rows, embedding_table_bytes
from dipdeploy.runtime.flash import FlashStore
from dipdeploy.runtime.kv import KvCache, KvShape
from dipdeploy.runtime.native_cache import choose_cache_library
from dipdeploy.runtime.rlimit import check_address_space, mapped_files, run_threads
from dipdeploy.runtime.sampler import Sampler
from dipdeploy.runtime.stats import RunStats, Timer, memory_now


class _Stopped(Exception):
    """``should_stop`` said stop between two prefill chunks (``Engine.prefill``)."""


@dataclass
class Generation:
    """``text`` is what was streamed: complete characters, cut before a stop string, no EOS token.
    ``finish`` says why it ended: "eos", "stop" (a stop string), "length" (``max_new_tokens``) or
    "interrupted" (``should_stop``), as a host reports it to its user."""

    prompt: str | None
    text: str
    tokens: list[int]
    stats: RunStats
    logits: list[np.ndarray] = field(default_factory=list)
    finish: str = "length"


class Engine:
    """Generation from a bundle under a DRAM budget (see the module docstring and ``EngineConfig``)."""

    def __init__(self, bundle: str | Path, config: EngineConfig | None = None, **overrides):
        import onnxruntime  # noqa: F401  (fail early with the import error, before any work)

        if config is not None and overrides:
            raise TypeError("give either an EngineConfig or keyword options, not both")
        self.cfg = config or EngineConfig(**overrides)
        self.path = Path(bundle)
        restore_interrupted(self.path)  # an export killed between its renames: its old bundle put back
        with held(self.path):  # a missing folder: the reader's one line
            pass
        #: the bundle folder every file is read through, held for the engine's life (``close``)
        self.files = BundleDir(self.path, lock=True)
        try:
            self._open()
        except BaseException:
            self.files.close()
            raise
        finally:
            self.files.release()  # an export may swap the folder now: everything the run reads is open

    def _open(self) -> None:
        from dipdeploy.ops.native import kernel_set, library_path, missing_library_hint, session_options

        self.manifest = m = open_bundle(self.files, self.cfg.verify)
        if m.plan is None:
            raise BundleError(f"{self.path} carries no sparsity plan; {REGENERATE}")
        plan = m.plan
        self.num_layers = len(plan["layers"])
        self.d, self.f = plan["hidden_size"], plan["intermediate_size"]
        self.k = [(lp["k_in"], lp["k_glu"]) for lp in plan["layers"]]
        self.baked_gamma = (m.dipca or {}).get("gamma", 1.0) if m.method == "dip-ca" else 1.0
        self.gamma = self.baked_gamma if self.cfg.gamma is None else self.cfg.gamma
        if (m.dipca or {}).get("gamma_warmup", 0):
            warnings.warn("the bundle's plan has a γ warm-up; the runtime applies γ from the first token",
                          stacklevel=2)
        native = self.cfg.native
        if native is None:
            native = library_path() is not None
            if not native:
                warnings.warn("no native op library: running the ONNX fallback functions (slower, and holding "
                              f"more than the plan); {missing_library_hint()}", stacklevel=2)
        self.native = native
        self.kernel_set = kernel_set() if native else None
        self._cache_library = choose_cache_library(native, self.cfg.native_cache)
        baked = int((m.export_config or {}).get("accuracy_level", 0)) if m.quant else 0
        self.accuracy_level = baked if self.cfg.accuracy_level is None else self.cfg.accuracy_level
        genai = read_json(self.files, m, GENAI_CONFIG)
        self.decoder = genai["model"]
        self._tokenizer = self._read_tokenizer() if TOKENIZER in m.files else None
        check_vocabulary(self.path, m, self._tokenizer.get_vocab_size(False) if self._tokenizer else None)
        self.vocab_rows = embedding_rows(m)  # every token id fed is checked against it
        limit = bundle_positions(self.path, m, genai)
        if self.cfg.context is None:
            self.cfg = dataclasses.replace(self.cfg, context=min(DEFAULT_CONTEXT, limit))
        elif self.cfg.context > limit:
            raise ValueError(f"--context {self.cfg.context} exceeds the {limit} positions of {self.path.name}'s "
                             f"model (max_position_embeddings, or the bundle's RoPE table); give --context {limit} "
                             f"or less")
        dec = self.decoder["decoder"]
        self.kv = KvCache(KvShape(self.num_layers, dec["num_key_value_heads"], dec["head_size"], self.cfg.context),
                          (m.export_config or {}).get("attention", "standard"))
        whole = choose_backend(self)  # chosen once, before any session opens (sets cfg.io)
        check_budget(m, self.cfg.dram_budget, self.kv.nbytes, memory_limit())
        check_address_space(m, self.cfg.dram_budget, self.kv.nbytes, run_threads(self.cfg.threads, self.cfg.io_threads),
                            maps=mapped_files(m, whole is not None, self.cfg.io))
        self._state = None
        self.backend: Decoder = open_backend(self, session_options, native, whole)
        self.flash = FlashStore(self.path / MLP_FILE, fd=self._open_file(MLP_FILE), io=self.cfg.io, cold=self.cfg.cold,
                                emulate=self.cfg.emulate,
                                io_threads=self.cfg.io_threads,
                                io_engine=self.cfg.io_engine, io_gap=self.cfg.io_gap,
                                size=(m.files.get(MLP_FILE) or {}).get("size"))
        self.backend.open_slabs()

    def __getattr__(self, name: str):
        """What the chosen backend holds (``slabs``, ``residency``, ``embedding``, the per-layer sessions,
        the joined ``fused`` model, ``read_ahead_setting``, ...), read as the engine's own."""
        backend = self.__dict__.get("backend")
        if backend is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(backend, name)

    @property
    def single_session(self) -> bool:
        """Whether this engine runs ``model.onnx`` once per token (``dipdeploy.runtime.backends.whole``)."""
        return self.backend.all_resident

    @property
    def native_cache(self) -> bool:
        """Whether the per-token cache step runs in the op library."""
        return self._cache_library is not None

    def _embedding_bytes(self) -> int:
        return embedding_table_bytes(self.manifest)

    def _open_file(self, name: str) -> int:
        """A checked descriptor of the bundle file ``name`` (``BundleDir.open``), the caller's to close."""
        with self.files.refusing():
            return self.files.open(name)

    def _read_tokenizer(self):
        """``tokenizer.json`` built from the bytes whose sha256 was checked, not reopened by name."""
        from tokenizers import Tokenizer

        try:
            with self.files.refusing():
                text = self.files.read_bytes(TOKENIZER).decode("utf-8")
        except UnicodeDecodeError:
            raise self.files.error(f"{TOKENIZER}: not UTF-8 text") from None
        return Tokenizer.from_str(text)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            raise BundleError(f"{self.path} has no {TOKENIZER}; give token ids, or {REGENERATE}")
        return self._tokenizer

    # -- one sequence ---------------------------------------------------------------------------
    def reset(self, future: list[tuple[np.ndarray, np.ndarray]] | None = None, policy: str | None = None) -> None:
        """Start a new sequence: empty KV cache, fresh caches (``static`` pins its rows now).
        ``policy`` overrides the configured one for this sequence (Belady's recording pass uses none)."""
        policy = policy or self.cfg.policy
        if policy_of(policy).needs_future and future is None and not self.backend.all_resident:
            raise ValueError(f"policy {policy!r} needs the future selections: use Engine.generate, which records "
                             "them in a first pass, or pass future=")
        self.backend.reset(future, policy)
        self.kv.reset()
        self._state = {"pos": 0, "ids": []}

    @property
    def sequence(self) -> list[int]:
        """The token ids the KV cache holds, in order (a copy)."""
        return list(self._state["ids"]) if self._state else []

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens of the sequence in the KV cache (a chat re-reads from there when its
        history changes). The DRAM row caches keep their rows: they are a cache, not the sequence."""
        st = self._state
        if st is None or not 0 <= n <= st["pos"]:
            raise ValueError(f"cannot keep {n} tokens of a sequence of {st['pos'] if st else 0}")
        self.kv.truncate(n)
        st["pos"], st["ids"] = n, st["ids"][:n]

    def step(self, token: int, timer: Timer, record=None) -> np.ndarray:
        """Feed one token; returns the logits [V] of the next one. ``record(layer, sel_in, sel_glu,
        hits_in, hits_glu)`` gets each layer's selections as views of the graph buffers, which the next
        token overwrites: a recorder that keeps them copies them (the per-layer path only)."""
        check_token_ids([token], self.vocab_rows)
        return self.backend.step(int(token), timer, record)

    def prefill(self, ids: list[int], timer: Timer, record=None,
                progress: Callable[[int, int], None] | None = None,
                should_stop: Callable[[], bool] | None = None) -> np.ndarray | None:
        """Feed ``ids`` in chunks of at most ``EngineConfig.prefill_chunk`` tokens, each one batch per
        layer (per-layer path), one run of the joined graph or of ``model.onnx``; returns the logits [V]
        after the last token. A chunk attends to the earlier ones through the KV cache, as a decoded token
        does, so chunking changes only the floating-point summation, and bounds the working set by the
        chunk instead of the prompt. ``progress(done, total)`` follows each chunk. ``should_stop()`` is
        asked after each chunk but the last (a host's Ctrl-C waits one chunk, not the whole prompt): when
        it says stop, the sequence holds the chunks fed and None is returned."""
        if self._state["pos"] + len(ids) > self.cfg.context:
            raise ValueError(f"context of {self.cfg.context} tokens is full; raise --context")
        check_token_ids(ids, self.vocab_rows)
        if should_stop is None:
            return self.backend.prefill(ids, timer, record, progress)

        def between(done: int, total: int) -> None:
            if progress is not None:
                progress(done, total)
            if done < total and should_stop():
                raise _Stopped  # between chunks: every backend has committed the chunk by now

        try:
            return self.backend.prefill(ids, timer, record, between)
        except _Stopped:
            return None

    def trace_recorder(self):
        """A ``TraceRecorder`` for ``generate(trace=...)`` (``dipdeploy.runtime.record.trace_recorder``)."""
        return recording.trace_recorder(self)

    # -- generation -----------------------------------------------------------------------------
    def encode(self, prompt: str, special_tokens: bool = True) -> list[int]:
        """Token ids of ``prompt`` as Hugging Face's tokenizer gives them: a raw prompt gets the tokenizer's
        special tokens (Gemma's ``<bos>``; SmolLM2's tokenizer adds none), a rendered chat template does not
        (it writes them itself, as ``apply_chat_template`` does: ``special_tokens=False``)."""
        return self.tokenizer.encode(prompt, add_special_tokens=special_tokens).ids

    def generate(self, prompt: str | list[int], max_new_tokens: int = 32, *, sampler: Sampler | None = None,
                 on_text: Callable[[str], None] | None = None, trace=None, keep_logits: bool = False,
                 stop_at_eos: bool = True, should_stop: Callable[[], bool] | None = None,
                 on_prefill: Callable[[int, int], None] | None = None, draft=None) -> Generation:
        """Feed ``prompt`` (batched or token by token: ``EngineConfig.prefill``), then sample up to
        ``max_new_tokens`` (see ``extend``).

        ``trace``: a ``dipdeploy.trace.TraceRecorder`` that receives every token's selections and hits.
        ``on_prefill(done, total)`` follows the prompt (once per token in token mode, once per chunk in
        batch mode). ``draft``: speculative decoding (``extend``).
        Policy ``belady`` runs the sequence twice: once with no cache to record the selections (DIP's
        selection does not depend on the cache when γ = 1), then with Belady over that future.
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty: give at least one token")
        check_token_ids(ids, self.vocab_rows)  # before Belady's recording pass
        if len(ids) + max_new_tokens > self.cfg.context:
            raise ValueError(f"prompt ({len(ids)} tokens) + {max_new_tokens} new tokens exceed the context of "
                             f"{self.cfg.context}; raise --context")
        future = None
        if policy_of(self.cfg.policy).needs_future and not self.backend.all_resident:  # all resident: nothing to foresee
            future = recording.record_future(self, ids, max_new_tokens, sampler, stop_at_eos)
        if self.cfg.cold:  # every run starts from the disk (also after Belady's recording pass)
            self.flash.drop_page_cache()
        sampler = sampler or Sampler()
        sampler.reset()
        self.reset(future)
        return self.extend(ids, max_new_tokens, sampler, on_text, trace, keep_logits, stop_at_eos,
                           prompt if isinstance(prompt, str) else None, should_stop=should_stop,
                           on_prefill=on_prefill, draft=draft)

    def teacher_forced(self, prompt: list[int], tokens: list[int]) -> tuple[list[np.ndarray], list[dict]]:
        """Logits and selections of a new sequence fed ``prompt`` then ``tokens[:-1]``
        (``dipdeploy.runtime.record.teacher_forced``)."""
        return recording.teacher_forced(self, prompt, tokens)

    def eos_ids(self) -> set[int]:
        """The bundle's end-of-sequence ids (genai_config.json's ``eos_token_id``: one id or a list)."""
        eos = self.decoder.get("eos_token_id")
        return set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()

    def extend(self, ids, max_new_tokens, sampler, on_text=None, trace=None, keep_logits=False,
               stop_at_eos=True, prompt=None, record=None, should_stop=None, on_prefill=None,
               draft=None) -> Generation:
        """Feed ``ids`` after what the sequence holds (no reset: the KV cache and the caches continue),
        then sample until EOS (``stop_at_eos``), one of ``sampler.stop``, ``max_new_tokens`` or
        ``should_stop()`` (asked before every token and between prefill chunks: a host's Ctrl-C, which
        must not cut a token's cache update in half). The last sampled token is not fed; a caller that continues feeds it first.

        ``on_text(piece)`` receives the answer's text as it becomes final (``dipdeploy.runtime.stream``:
        whole UTF-8 characters, never a stop string); ``on_prefill(done, total)`` follows ``ids``.
        ``draft``: a ``dipdeploy.runtime.speculate`` draft; the tokens then come from its proposals and
        the target's verification passes (the engine opened with ``EngineConfig.speculate``)."""
        from dipdeploy.runtime import speculate
        from dipdeploy.runtime.stream import TextStream

        timer = Timer()
        eos = self.eos_ids() if stop_at_eos else set()
        stopped = should_stop or (lambda: False)

        def show(piece: str) -> None:
            if piece and on_text is not None:
                on_text(piece)

        feed = recording.feed(trace, record)
        if feed is not None and not self.backend.records_selections:
            raise ValueError(self.backend.per_layer_only("traces and recorded selections"))
        if draft is not None:
            speculate.check_draft(self, draft)
            if feed is not None:
                raise ValueError("speculative decoding records no per-layer selections: drop --speculate")
        base = self.backend.lookups()  # [layer, group, (hits, lookups)] since the caches' reset

        stream = TextStream(self.tokenizer, sampler.stop)
        new, kept, finish = [], [], "length"
        t0, flash0 = time.perf_counter(), self.flash.counters.snapshot()
        logits = None
        by_token = self.cfg.prefill == "token"
        if not by_token and ids:
            logits = None if stopped() else self.prefill([int(t) for t in ids], timer, feed, on_prefill, stopped)
            finish = "interrupted" if logits is None else finish
        for n, t in enumerate(ids if by_token else []):
            if stopped():
                finish = "interrupted"
                break
            logits = self.step(int(t), timer, feed)
            if on_prefill is not None:
                on_prefill(n + 1, len(ids))
        t1, flash1 = time.perf_counter(), self.flash.counters.snapshot()
        hits_prefill = self.backend.lookups() - base
        fed = self._state["pos"]
        spec = speculate.SpeculationStats() if draft is not None else None
        if finish == "interrupted" or max_new_tokens == 0:
            source = (_ for _ in ())
        elif draft is not None:
            source = speculate.tokens(self, draft, logits, sampler, max_new_tokens, timer, spec, time.perf_counter)
        else:
            source = self._plain_tokens(logits, sampler, max_new_tokens, timer, feed)
        while True:
            if stopped():
                finish = "interrupted" if len(new) < max_new_tokens else finish
                break
            item = next(source, None)
            if item is None:
                break
            tok, chosen_from = item
            if keep_logits:
                kept.append(chosen_from.copy())
            new.append(tok)
            if tok not in eos:
                show(stream.push(tok))
            if tok in eos or stream.stopped is not None:
                finish = "eos" if tok in eos else "stop"
                break
        source.close()
        if self._state["pos"] > fed + max(len(new) - 1, 0):  # a verification pass fed tokens past the answer
            self.truncate(fed + max(len(new) - 1, 0))
        show(stream.finish())
        t2 = time.perf_counter()
        hits = self.backend.lookups() - base
        stats = RunStats.collect(self, len(ids), len(new), t1 - t0, t2 - t1, timer, hits, hits_prefill,
                                 flash1 - flash0, self.flash.counters - flash1, memory_now())
        if spec is not None:
            stats.speculation = {"draft": draft.name, "k": self.cfg.speculate, **spec.as_dict()}
        return Generation(prompt, stream.text, new, stats, kept, finish)

    def _plain_tokens(self, logits, sampler, max_new_tokens, timer, feed):
        """The tokens of plain decoding, each with the logits it was sampled from: sample, then feed it
        unless it is the last."""
        for n in range(max_new_tokens):
            tok = sampler(logits, self._state["ids"])  # the sampled tokens before it are fed already
            yield tok, logits
            if n == max_new_tokens - 1:
                return
            logits = self.step(tok, timer, feed)

    def close(self) -> None:
        self.backend.close()
        self.flash.close()
        self.files.close()
