"""Scenario files: the flags of a published table kept beside it, so one command regenerates the table.

A scenario is a small TOML file under ``benchmarks/scenarios/``: ``suite`` (the suite it runs), ``title``
(what the table shows), optionally ``published`` (the results file it backs), and a ``[flags]`` table whose
keys are the suite's options by their long names without dashes (``model``, ``method``, ``budget``,
``n_prompt``, ``repetitions``, ...), each value a string, a number or a list of them, as a comma list
would give them; a path (``gguf``, ``llama_python``, ...) is one string, ``~`` standing for the home
folder. A flag given on the command line replaces the file's value of that flag; every other
flag keeps its default. Unknown keys, a suite other than the one run and a file larger than
``MAX_BYTES`` are refused in one line.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

#: a scenario holds a few flags: anything larger is a wrong file
MAX_BYTES = 64 << 10
#: the flags each suite takes from a scenario (its options' long names, dashes as underscores)
_GRID = ("model", "method", "density", "budget", "io", "threads", "n_prompt", "n_gen", "repetitions", "quant")
#: the peer flags: paths, one each (``dipdeploy.bench.peers``)
_PATHS = ("gguf", "genai_model", "llama_python", "genai_python")
_ACCURACY = ("seqlen", "windows", "limit", "threads", "data_dir", "device")
_SIMULATE = ("steps", "tokens", "proj_tokens", "warmup", "source", "data_dir")
_READS = ("tokens", "size", "dir")
FLAGS = {"decode": _GRID + ("limit", "cold", "gamma", "accuracy_level", "peer") + _PATHS, "memory": _GRID + ("limit",),
         "accuracy": ("model", "method", "density", "allocation", "quant", "task") + _ACCURACY,
         "simulate": ("trace", "density", "model", "device", "method", "policy", "gamma", "precision") + _SIMULATE,
         "reads": ("model", "io", "row_bytes", "density", "order", "prefetch", "io_engine", "gap", "depth", "cache",
                   "budget", "repetitions") + _READS,
         "kernels": ("model", "shape", "quant", "density", "threads", "impl", "accuracy_level", "cache", "kernel_set",
                     "calls", "repetitions")}
#: each suite's flags whose value is one scalar, not a list (a whole number where ``_INTS`` names it, else a
#: string); ``quant`` is a list in the kernels suite
SCALARS = {"decode": ("repetitions", "quant") + _PATHS, "memory": ("repetitions", "quant"), "accuracy": _ACCURACY,
           "simulate": _SIMULATE, "reads": ("repetitions",) + _READS, "kernels": ("repetitions", "calls")}
_INTS = ("repetitions", "seqlen", "windows", "limit", "threads", "steps", "tokens", "proj_tokens", "warmup", "calls")
_KEYS = ("suite", "title", "published", "flags")


@dataclass(frozen=True)
class Scenario:
    path: Path
    suite: str
    title: str
    flags: dict = field(default_factory=dict)
    published: str | None = None

    def value(self, name: str, given):
        """``given`` (the command line's value) when the user gave it, else the file's, else None: lists
        as lists of strings (what a repeated flag gives), a scalar flag as the file's scalar."""
        if name == "cold":  # a switch: on when the command line or the file turns it on
            return bool(given) or bool(self.flags.get(name))
        if given not in (None, [], ()):
            return given
        raw = self.flags.get(name)
        if raw is None:
            return given
        if name in SCALARS[self.suite]:
            return raw
        return [str(v) for v in raw] if isinstance(raw, list) else [str(raw)]


def _flag_value(path: Path, suite: str, name: str, value) -> None:
    scalar = (str, int, float)
    one = name in SCALARS[suite]
    if one and name in _INTS:
        ok = type(value) is int
    elif name == "cold":
        ok = type(value) is bool
    elif one:
        ok = isinstance(value, str) and bool(value)
    else:
        ok = (isinstance(value, scalar) and type(value) is not bool) or (
            isinstance(value, list) and value and all(isinstance(v, scalar) and type(v) is not bool for v in value))
    if not ok:
        want = ("whole number" if one and name in _INTS else "boolean (true or false)" if name == "cold"
                else "string" if one else "value or a list of values")
        raise ValueError(f"--scenario {path}: flags.{name} = {value!r} is not a {want}")


def load(path: Path | str, suite: str | None = None) -> Scenario:
    """The scenario at ``path`` for ``suite`` (None: the suite the file names), every key and value checked."""
    from dipdeploy.paths import check_input_file, read_capped

    path = check_input_file(Path(path), "--scenario")
    data = read_capped(path, MAX_BYTES)
    if data is None:
        raise ValueError(f"--scenario {path} is larger than {MAX_BYTES >> 10} KiB; give a scenario file "
                         f"(a few flags in TOML)")
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"--scenario {path} is not UTF-8 TOML ({err})") from None
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise ValueError(f"--scenario {path}: unknown keys {', '.join(unknown)}; a scenario holds "
                         f"{', '.join(_KEYS)}")
    if raw.get("suite") not in FLAGS or (suite is not None and raw.get("suite") != suite):
        raise ValueError(f"--scenario {path} is for the suite {raw.get('suite')!r}; run it with "
                         f"`dipdeploy bench {raw.get('suite')} --scenario {path}`" if raw.get("suite") in FLAGS
                         else f"--scenario {path}: suite = {raw.get('suite')!r} is not one of {', '.join(FLAGS)}")
    suite = raw["suite"]
    flags = raw.get("flags", {})
    if not isinstance(flags, dict):
        raise ValueError(f"--scenario {path}: flags must be a table ([flags])")
    bad = sorted(set(flags) - set(FLAGS[suite]))
    if bad:
        raise ValueError(f"--scenario {path}: flags {', '.join(bad)} are not options of `bench {suite}`; it "
                         f"takes {', '.join(FLAGS[suite])}")
    for name, value in flags.items():
        _flag_value(path, suite, name, value)
    for key in ("title", "published"):
        if key in raw and not isinstance(raw[key], str):
            raise ValueError(f"--scenario {path}: {key} must be a string")
    return Scenario(path, suite, raw.get("title", path.stem), flags, raw.get("published"))
