"""The training text of `dipdeploy finetune` and the rule that keeps it apart from the evaluation text.

Sources (``LoraConfig.data`` or ``text_file``):

- ``wikitext2-valid`` — WikiText-2 validation (the LM objective's default);
- ``pydoc-topics`` — the documentation text that ships inside Python itself (``pydoc_data.topics``: the
  Language Reference sections ``help('TOPIC')`` prints, about 465 k characters, 113 k SmolLM2 tokens),
  present wherever the interpreter is, downloaded from nowhere, and unrelated to Wikipedia. It is the
  distillation objective's default: distilling on WikiText would mix recovery from pruning with
  adaptation to the evaluation corpus (benchmarks/results/lora-smollm2.md, the control rows);
- ``dense-samples`` — text the dense model samples itself (temperature 1 from its BOS token, one fresh
  window per training window, :func:`dense_samples`): the teacher's own distribution, so distillation
  matches it where the teacher puts its mass rather than on one corpus, and no window is seen twice
  (on pydoc topics a second epoch lowered the training KL but not WikiText perplexity) unless
  ``LoraConfig.sample_windows`` caps the draw. Sampled on the GPU where there is one. On SmolLM2 at
  ρ = 0.5 it recovers no more than pydoc (benchmarks/results/lora-smollm2.md).
  Under a multi-process launch every process samples the same windows and trains on its share, so each
  sees fewer windows than steps × batch and repeats them;
- a user's UTF-8 file.

The exclusion rule (:func:`check_not_evaluation_text`): a training text that reproduces lines of the
WikiText-2 *test* split (the evaluation set) is refused under any objective, and one that reproduces lines
of the *validation* split too under ``distill``. Lines are compared whole (stripped, at least
:data:`_MIN_LINE` characters, so headings and blank lines never match by chance), against the copy of
WikiText-2 the evaluator itself would read; where none is found there is nothing to compare against.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dipdeploy.finetune.config import DEFAULT_DATA, LoraConfig

_MIN_LINE = 64  # characters: a whole line this long shared with WikiText is no coincidence
_MAX_SHARED = 0.01  # fraction of a text's long lines that may coincide with WikiText before it is refused


def pydoc_topics() -> str:
    """Python's bundled pydoc topics, in a fixed (sorted) order, joined as WikiText rows are."""
    try:
        from pydoc_data.topics import topics
    except ImportError as err:  # some distributions strip it from the standard library
        raise ValueError(f"data pydoc-topics: this Python has no pydoc_data module ({err}); "
                         f"pass --text-file FILE instead") from err
    return "\n\n".join(topics[k] for k in sorted(topics))


def source_text(cfg: LoraConfig, data_dir: str | Path | None = None) -> str:
    """The raw training text ``cfg`` names."""
    from dipdeploy.data import load_text

    if cfg.text_file is None and cfg.data == "pydoc-topics":
        return pydoc_topics()
    return load_text("wikitext2", "validation", cfg.text_file, data_dir)


def _long_lines(text: str) -> list[str]:
    return [s for s in (line.strip() for line in text.splitlines()) if len(s) >= _MIN_LINE]


def check_not_evaluation_text(text: str, cfg: LoraConfig, data_dir: str | Path | None = None) -> None:
    """Raise ValueError when ``text`` (a user file) reproduces the WikiText-2 splits ``cfg`` must not see."""
    from dipdeploy.data import wikitext_text

    if cfg.text_file is None:  # a named source is the one it says (config.py refuses the forbidden ones)
        return
    lines = _long_lines(text)
    if not lines:
        return
    splits = ("test", "validation") if cfg.objective == "distill" else ("test",)
    for split in splits:
        try:
            reference = set(_long_lines(wikitext_text(split, data_dir)))
        except FileNotFoundError:
            continue
        shared = sum(line in reference for line in lines)
        if shared > _MAX_SHARED * len(lines):
            use = "the evaluation set" if split == "test" else "WikiText, which distillation must not see"
            raise ValueError(
                f"--text-file {cfg.text_file}: {shared} of its {len(lines)} long lines are WikiText-2 {split} "
                f"text ({use}); train on other text (--data {DEFAULT_DATA[cfg.objective]} or a file that is not "
                f"WikiText)"
            )


def samples_the_model(cfg: LoraConfig) -> bool:
    """Whether ``cfg`` trains on windows the model samples itself (no text to read or check)."""
    return cfg.text_file is None and cfg.data == "dense-samples"


def sampled_windows(cfg: LoraConfig) -> int:
    """How many windows ``dense-samples`` draws: one per window the training reads, or
    ``cfg.sample_windows`` where that is fewer (the training then reads them in turn, epoch after epoch)."""
    trained = cfg.total_steps() * cfg.batch_size * cfg.grad_accum
    return trained if cfg.sample_windows is None else min(cfg.sample_windows, trained)


def training_text(cfg: LoraConfig, data_dir: str | Path | None = None) -> str:
    """The training text, checked against the evaluation text (the CLI calls this before any work);
    empty for ``dense-samples``, which has no text until the model writes it."""
    if samples_the_model(cfg):
        return ""
    text = source_text(cfg, data_dir)
    check_not_evaluation_text(text, cfg, data_dir)
    return text


def training_windows(lm, cfg: LoraConfig, data_dir: str | Path | None = None) -> torch.Tensor:
    """All non-overlapping ``cfg.seqlen`` windows of the training text (``dense-samples``: the
    :func:`sampled_windows` the model draws)."""
    from dipdeploy.data import windows

    if samples_the_model(cfg):
        return dense_samples(lm, sampled_windows(cfg), cfg.seqlen, cfg.seed, cfg.bf16)
    return windows(lm.tokenizer, training_text(cfg, data_dir), cfg.seqlen, None)


SAMPLE_BATCH = 32  # windows sampled side by side on a CPU: one forward per position for all of them
#: ... on a GPU, where a step of the eager model costs its kernel launches whatever the batch, so a wider
#: batch samples more windows in the same time (its KV cache: windows × tokens × layers × 2 × kv heads × head dim)
SAMPLE_BATCH_GPU = 1024


@torch.no_grad()
def dense_samples(lm, n: int, seqlen: int, seed: int, bf16: bool = False) -> torch.Tensor:
    """``n`` windows [n, seqlen] of the model's own text: its BOS token (the first vocabulary id where it
    has none), then ``seqlen - 1`` tokens sampled at temperature 1 from the full distribution, past EOS
    too (what follows an end is still the model's text). ``lm`` must be dense (no DIP masks): these are
    the teacher's samples. Seeded, so a resumed run trains on the same windows (on the same kind of
    device: a GPU draws other numbers than a CPU from the same seed); ``bf16``: the forward under bf16
    autocast, as the training's (benchmarks/results/lora-smollm2.md, "bf16"). Runs where the model is; the windows
    come back on the CPU."""
    import inspect

    from dipdeploy.torchdevice import device_of

    model = lm.model
    device = device_of(model)
    batch = SAMPLE_BATCH if device.type == "cpu" else SAMPLE_BATCH_GPU
    bos = lm.tokenizer.bos_token_id
    # transformers 5 renamed the KV-cache argument and output (past_key_values → cache)
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    gen = torch.Generator(device).manual_seed(seed)
    out = torch.empty(n, seqlen, dtype=torch.long)
    was_training = model.training
    model.eval()
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            for lo in range(0, n, batch):
                rows = torch.empty(min(batch, n - lo), seqlen, dtype=torch.long, device=device)
                rows[:, 0] = 0 if bos is None else bos
                past, ids = None, rows[:, :1]
                for t in range(1, seqlen):
                    res = model(input_ids=ids, use_cache=True, **{key: past})
                    past = getattr(res, key)
                    probs = torch.softmax(res.logits[:, -1].float(), dim=-1)
                    rows[:, t] = torch.multinomial(probs, 1, generator=gen)[:, 0]
                    ids = rows[:, t:t + 1]
                out[lo:lo + len(rows)] = rows.cpu()
    finally:
        model.train(was_training)
    return out
