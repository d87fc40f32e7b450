"""Benchmark of replacing a bundle under signals, and of concurrent exports to one --out.

Part 1, signal injection: a tiny-llama bundle (the "old" one, with a marker file) is replaced by
``export --force`` in a child process that sends itself SIGKILL or SIGINT at one point of the export:
while the bundle is being written (before its manifest), and before each step of the swap
(``dipdeploy.dirswap.STEPS``: aside, in, drop, done), and half-way through removing the old bundle
(``mid-drop``). After the child is gone, --out is checked (manifest present and every file at its
size, old or new), and so are its siblings; then a normal export (``--force``, in this process) runs
and the leftovers next to --out are counted again.

Part 2, race: two ``dipdeploy export`` processes to one fresh --out without --force, started
together, ``--race`` times: one must finish and the other be refused (exit 2) by the lock or,
when it arrives after the winner finished, by the existing bundle.

    nice -n 10 python benchmarks/export_swap.py --quick    # one trial per point and signal, 3 races
    nice -n 10 python benchmarks/export_swap.py            # 3 trials per point and signal, 10 races

Writes benchmarks/results/export_swap.md (and --json OUT).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import machine, md_table, write_rows_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MARK = "old.marker"
TINY = ["--model", "tiny-llama", "--rho-in", "0.6", "--validate-tokens", "0"]
POINTS = ("write", "aside", "in", "drop", "mid-drop", "done")
SIGNALS = ("SIGKILL", "SIGINT")
MODES = ("exchange", "renames")

CHILD = """
import os, signal, sys
from pathlib import Path
from dipdeploy import dirswap
from dipdeploy.export import bundle
from dipdeploy.export.config import ExportConfig
out, point, sig = Path(sys.argv[1]), sys.argv[2], getattr(signal, sys.argv[3])
dirswap.EXCHANGE = sys.argv[4] == "exchange"
def die():
    os.kill(os.getpid(), sig)
def hook(step):
    if step == point:
        die()
if point == "write":
    real = bundle._manifest
    def manifest(*a, **k):
        die()
        return real(*a, **k)
    bundle._manifest = manifest
if point == "mid-drop":
    real_rmtree = dirswap.shutil.rmtree
    def rmtree(path, **kw):
        dirswap.shutil.rmtree = real_rmtree  # signal once: the cleanup's own rmtree is the real one
        next(Path(path).iterdir()).unlink()
        die()
        real_rmtree(path, **kw)
    dirswap.shutil.rmtree = rmtree
bundle.export_model(ExportConfig(model="tiny-llama", rho_in=0.6, validate_tokens=0, quant="bq4"), out,
                    force=True, swap_hook=hook)
"""


def _complete(out: Path) -> bool:
    from dipdeploy.bundle.manifest import Manifest, verify
    from dipdeploy.bundle.names import MANIFEST

    if not (out / MANIFEST).is_file():
        return False
    return verify(out, Manifest.from_json((out / MANIFEST).read_text())) == []


def _siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def _stranded(out: Path) -> int:
    return sum(1 for n in _siblings(out) if ".tmp-" in n or ".old-" in n)


def signal_trial(template: Path, work: Path, mode: str, point: str, sig: str) -> dict:
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    out = work / "b"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shutil.copytree(template, out)
    child = subprocess.run([sys.executable, "-c", CHILD, str(out), point, sig, mode], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    at_out = _complete(out)
    old_aside = [n for n in _siblings(out) if ".old-" in n and _complete(out.parent / n)]
    state = ("old" if (out / MARK).exists() else "new") if at_out else (
        "missing, complete old aside" if old_aside else "lost")
    left = _stranded(out)
    notes: list[str] = []
    export_model(ExportConfig(model="tiny-llama", rho_in=0.6, validate_tokens=0), out, force=True,
                 notice=notes.append)
    return {"swap": mode, "point": point, "signal": sig, "child_rc": child.returncode, "complete_at_out": at_out,
            "bundle_after_kill": state, "leftovers_after_kill": left, "reported": len(notes),
            "complete_after_next": _complete(out), "stranded_after_next": _stranded(out)}


def race_trial(work: Path) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    out = work / "b"
    cmd = [sys.executable, "-c", "from dipdeploy.cli import app; app()", "export", *TINY, "--out", str(out)]
    procs = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    res = [(p.wait(timeout=600), p.stdout.read()) for p in procs]
    codes = sorted(rc for rc, _ in res)
    loser = next((text for rc, text in res if rc == 2), "")
    why = "lock" if "another export is writing" in loser else ("exists" if "exists" in loser else "-")
    return {"codes": codes, "one_wins_other_refused": codes == [0, 2], "refused_by": why,
            "complete": _complete(out), "stranded": _stranded(out)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--trials", type=int, default=None, help="per point and signal (default 3, --quick 1)")
    ap.add_argument("--race", type=int, default=None, help="race trials (default 10, --quick 3)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    trials = args.trials or (1 if args.quick else 3)
    races = args.race or (3 if args.quick else 10)

    from dipdeploy import dirswap
    from dipdeploy.export.bundle import export_model
    from dipdeploy.export.config import ExportConfig

    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="export-swap-") as tmp:
        tmp = Path(tmp)
        fs = subprocess.run(["stat", "-f", "-c", "%T", str(tmp)], capture_output=True, text=True).stdout.strip()
        template = tmp / "template"
        export_model(ExportConfig(model="tiny-llama", rho_in=0.6, validate_tokens=0), template)
        (template / MARK).write_text("old")
        modes = [m for m in MODES if m == "renames" or dirswap._can_exchange(tmp)]
        rows = [signal_trial(template, tmp / "w", mode, point, sig)
                for _ in range(trials) for mode in modes for point in POINTS for sig in SIGNALS]
        race = [race_trial(tmp / "r") for _ in range(races)]
    summary = []
    for mode, point, sig in [(m, p, s) for m in modes for p in POINTS for s in SIGNALS]:
        rs = [r for r in rows if (r["swap"], r["point"], r["signal"]) == (mode, point, sig)]
        if rs:
            summary.append({
                "swap": mode, "point": point, "signal": sig, "trials": len(rs),
                "complete_at_out": sum(r["complete_at_out"] for r in rs),
                "bundle_after_kill": ", ".join(sorted({r["bundle_after_kill"] for r in rs})),
                "leftovers_after_kill": sum(r["leftovers_after_kill"] for r in rs),
                "complete_after_next": sum(r["complete_after_next"] for r in rs),
                "stranded_after_next": sum(r["stranded_after_next"] for r in rs)})
    race_row = {"trials": len(race), "one_wins_other_refused": sum(r["one_wins_other_refused"] for r in race),
                "refused_by_lock": sum(r["refused_by"] == "lock" for r in race),
                "refused_by_exists": sum(r["refused_by"] == "exists" for r in race),
                "complete": sum(r["complete"] for r in race), "stranded": sum(r["stranded"] for r in race)}
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")),
                 machine()["cpu"])
    m = machine()
    cmd = "python benchmarks/export_swap.py" + (" --quick" if args.quick else "")
    md = [
        "# Export under signals, and concurrent exports", "",
        f"CPU {model}, {m['cores']} cores, Python {m['python']}, load (1 min) {m['load_1min']} · `{cmd}` · "
        f"tiny-llama (rho_in 0.6, no validation), the old bundle fp32, the new one BQ4 · "
        f"filesystem {fs or '?'} · {time.time() - t0:.0f} s in all", "",
        "## Signals at each point of `export --force` (the child signals itself)", "",
        "`swap`: `exchange` is one renameat2(RENAME_EXCHANGE) (used where the filesystem supports it), "
        "`renames` the two-rename fallback (forced here with `dirswap.EXCHANGE = False`). "
        "`complete_at_out`: trials with a complete bundle (manifest.json and every file at its size) at --out "
        "right after the child died; `bundle_after_kill`: which one (old / new, or --out missing with the "
        "complete old bundle moved aside, which the next export or open restores); `leftovers_after_kill`: "
        "`.b.tmp-*` / `.b.old-*` next to --out then; `stranded_after_next`: the same after the next export.", "",
        md_table(summary, ["swap", "point", "signal", "trials", "complete_at_out", "bundle_after_kill",
                           "leftovers_after_kill", "complete_after_next", "stranded_after_next"]), "",
        "## Two exports to one fresh --out without --force, started together", "",
        md_table([race_row], list(race_row)), "",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "export_swap.md").write_text("\n".join(md))
    print("\n".join(md))
    write_rows_json({"machine": {**m, "cpu": model}, "signals": rows, "race": race}, args.json)


if __name__ == "__main__":
    main()
