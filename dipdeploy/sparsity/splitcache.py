"""The split search's result kept on disk, per model weights, calibration text, density and score.

Why: the search runs plain DIP at a few input shares over the calibration windows (a forward pass each),
minutes on a 1.5 B model on a laptop CPU, and every `eval`, `calibrate` and `export` of the same model at
the same density asks the same question again. The answer depends only on the weights (after any
quantisation or merged adapter), the windows' tokens, ρ, the score and the shares tried, so those are
hashed into the entry's name (:func:`split_key`); a changed model, text or option is a new entry, never
a stale answer. An unreadable entry is searched again and replaced. Floor 3 (torch for the fingerprint).
"""

from __future__ import annotations

import hashlib
import json
from typing import Callable

from dipdeploy.paths import cache_dir, write_atomic

#: Elements hashed from each end of every MLP weight: enough to tell quantised, adapted and other
#: checkpoints apart without reading gigabytes per calibration.
FINGERPRINT_ELEMENTS = 4096
#: Bumped when the search itself changes (its candidates, its NLL), so no answer of an older search is reused.
VERSION = 1


def model_fingerprint(lm) -> str:
    """The weights' identity: a streamed model (weights on disk) by its checkpoint file's path, size and
    mtime; a loaded one by the two ends of every MLP weight and the config."""
    h = hashlib.sha256(lm.model.config.to_json_string().encode())
    if getattr(lm, "checkpoint", None) is not None:
        path = lm.checkpoint.directory
        st = path.stat()
        h.update(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
        return h.hexdigest()
    for name, p in lm.model.named_parameters():
        if ".mlp." in name:
            flat = p.detach().reshape(-1)
            h.update(name.encode())
            h.update(flat[:FINGERPRINT_ELEMENTS].float().cpu().numpy().tobytes())
            h.update(flat[-FINGERPRINT_ELEMENTS:].float().cpu().numpy().tobytes())
    return h.hexdigest()


def split_key(lm, windows, density: float, score: str, ratios: tuple[float, ...], search: str) -> str:
    what = [VERSION, model_fingerprint(lm), hashlib.sha256(windows.cpu().numpy().tobytes()).hexdigest(),
            list(windows.shape), round(density, 6), score, list(ratios), search]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:24]


def cached_split(lm, cfg, windows, search: Callable, ratios: tuple[float, ...]) -> tuple[float, dict]:
    """``search(lm, cfg, windows)`` → (ρ_in, info), answered from the cache when it has asked before. The
    answer is the same either way (no mark of where it came from), so a plan, and the bundle that embeds
    it, is byte-identical whether its split was searched now or earlier."""
    name = getattr(getattr(search, "func", search), "__name__", "search")
    path = cache_dir("splits", f"{split_key(lm, windows, cfg.density, cfg.score, ratios, name)}.json")
    try:
        kept = json.loads(path.read_text())
        return float(kept["rho_in"]), kept["info"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    rho_in, info = search(lm, cfg, windows)
    write_atomic(path, json.dumps({"rho_in": rho_in, "info": info}), force=True)
    return rho_in, info
