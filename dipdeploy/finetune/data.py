"""The training text of `dipdeploy finetune` and the rule that keeps it apart from the evaluation text.

Sources (``LoraConfig.data`` or ``text_file``):

- ``wikitext2-valid`` — WikiText-2 validation (the LM objective's default);
- ``pydoc-topics`` — the documentation text that ships inside Python itself (``pydoc_data.topics``: the
  Language Reference sections ``help('TOPIC')`` prints, about 465 k characters, 113 k SmolLM2 tokens),
  present wherever the interpreter is, downloaded from nowhere, and unrelated to Wikipedia. It is the
  distillation objective's default: distilling on WikiText would mix recovery from pruning with
  adaptation to the evaluation corpus (benchmarks/results/lora-smollm2.md, the control rows);
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
    from dipdeploy.eval.data import load_text

    if cfg.text_file is None and cfg.data == "pydoc-topics":
        return pydoc_topics()
    return load_text("wikitext2", "validation", cfg.text_file, data_dir)


def _long_lines(text: str) -> list[str]:
    return [s for s in (line.strip() for line in text.splitlines()) if len(s) >= _MIN_LINE]


def check_not_evaluation_text(text: str, cfg: LoraConfig, data_dir: str | Path | None = None) -> None:
    """Raise ValueError when ``text`` (a user file) reproduces the WikiText-2 splits ``cfg`` must not see."""
    from dipdeploy.eval.data import wikitext_text

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


def training_text(cfg: LoraConfig, data_dir: str | Path | None = None) -> str:
    """The training text, checked against the evaluation text (the CLI calls this before any work)."""
    text = source_text(cfg, data_dir)
    check_not_evaluation_text(text, cfg, data_dir)
    return text


def training_windows(lm, cfg: LoraConfig, data_dir: str | Path | None = None) -> torch.Tensor:
    """All non-overlapping ``cfg.seqlen`` windows of the training text."""
    from dipdeploy.eval.data import windows

    return windows(lm.tokenizer, training_text(cfg, data_dir), cfg.seqlen, None)
