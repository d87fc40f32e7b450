"""Export's default density on the default model: answers to everyday questions and perplexity per ρ.

SmolLM2-135M-Instruct exported as the README's quickstart does (``export --method dip-ca --quant bq4``)
at each ``--densities`` value (1.0: every row, ``--method dip --rho-in 1``, the dense weights through the
same runtime), each bundle asked three everyday questions through ``dipdeploy run --chat`` (greedy, at
every ``--repetition-penalties`` value, the runtime's default budget), and the same plans' WikiText-2
perplexity from ``dipdeploy eval --quant bq4`` (the torch reference of what the bundles compute). An
answer is *right* when it holds what the question asks (:data:`QUESTIONS`), and *loops* when it ends in
one piece of text repeated (:func:`loops`). The default density (``SparsityConfig.density``) is the
smallest ρ whose answers are right and do not loop, at a small perplexity cost against dense
(docs/decisions/0012-default-density.md).

    python benchmarks/default_density.py --data-dir /work/shared/data            # 4 windows × 512 tokens
    python benchmarks/default_density.py --densities 0.7 --repetition-penalties 1,1.1 --reuse

Every command runs through the CLI, one at a time; bundles go to ``--work`` (not in git). Writes
benchmarks/results/default-density-smollm2-135m.md (and --json OUT).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from _common import lscpu, machine, md_table, write_rows_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "default-density-smollm2-135m.md"
MODEL = "smollm2-135m"
PLANETS = r"(?i)\b(mercury|venus|earth|mars|jupiter|saturn|uranus|neptune|pluto)\b"
MAX_NEW_TOKENS = 64


def three_planets(text: str) -> bool:
    """The first three planets the answer names are Mercury, Venus and Earth (in any order)."""
    named = list(dict.fromkeys(m.lower() for m in re.findall(PLANETS, text)))
    return set(named[:3]) == {"mercury", "venus", "earth"}


def rhymes_with_cat(text: str) -> bool:
    """Among the answer's first 15 words is one ending in -at other than cat, that or what."""
    words = re.findall(r"[a-z]+", text.lower())[:15]
    return any(w.endswith("at") and w not in ("cat", "that", "what") for w in words)


#: (question, what a right answer holds: a pattern it must contain, or a check of the text).
QUESTIONS = (
    ("Name the three planets closest to the Sun.", three_planets),
    ("What is the boiling point of water at sea level in Celsius?", r"\b100\b"),
    ("Give one word that rhymes with 'cat'.", rhymes_with_cat),
)


def loops(text: str) -> bool:
    """The answer goes round: it ends in one piece of text (1 to 40 characters, not only blanks) said over
    and over for at least 12 characters (an ellipsis is no loop; a row of bullets is), or some 30 characters
    of it come back three times (a sentence said again and again)."""
    tail = text.rstrip()
    ends = any(tail[-n:].strip() and re.search(rf"(.{{{n}}})\1{{{max(2, -(-12 // n) - 1)},}}$", tail, re.S)
               for n in range(1, 41))
    return ends or any(text.count(text[i:i + 30]) >= 3 for i in range(len(text) - 29))


def right(text: str, check) -> bool:
    return check(text) if callable(check) else re.search(check, text) is not None


def call(args: list[str]) -> None:
    """One CLI command, the ``dipdeploy`` installed beside this interpreter."""
    exe = Path(sys.executable).parent / "dipdeploy"
    done = subprocess.run([str(exe if exe.exists() else "dipdeploy"), *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"dipdeploy {shlex.join(args)} failed ({done.returncode}): {done.stderr.strip()[-600:]}")


def export_args(rho: float, out: Path, data_dir: str | None) -> list[str]:
    sparse = ["--method", "dip-ca", "--density", f"{rho:g}"] if rho < 1 else ["--method", "dip", "--density", "1",
                                                                              "--rho-in", "1"]
    return (["export", "--model", MODEL, *sparse, "--quant", "bq4", "--out", str(out), "--force"]
            + (["--data-dir", data_dir] if data_dir else []))


def judge(text: str, finish: str, check, dense: str | None) -> dict[str, bool]:
    """One answer: right (its question's check), the same text as the dense bundle's, ended by the model
    within the token limit, looping; *sane* when it ends without looping and is right wherever dense is
    (a sparse model should not lose what the dense one knows, nor ramble where it stops)."""
    ok, dense_ok = right(text, check), dense is None or right(dense, check)
    out = {"right": ok, "as_dense": text == dense, "ends": finish == "eos", "loops": loops(text)}
    return {**out, "sane": out["ends"] and not out["loops"] and (ok or not dense_ok)}


def ask(bundle: Path, question: str, penalty: float, out: Path, reuse: bool) -> dict:
    if reuse and out.is_file():
        return json.loads(out.read_text())
    call(["run", str(bundle), "--chat", "-p", question, "-n", str(MAX_NEW_TOKENS), "--repetition-penalty",
          f"{penalty:g}", "--json", str(out), "--force", "-q"])
    return json.loads(out.read_text())


def perplexities(densities: list[float], windows: int, seqlen: int, data_dir: str | None, work: Path,
                 reuse: bool) -> dict:
    sparse = ",".join(f"{d:g}" for d in densities if d < 1)
    out = work / f"eval-{windows}x{seqlen}-{sparse or 'dense'}.json"  # --reuse keeps it
    args = ["eval", "--model", MODEL, "--method", "dense,dip-ca" if sparse else "dense", "--quant", "bq4",
            "--max-windows", str(windows), "--seqlen", str(seqlen), "--json", str(out), "--force"]
    args += (["--density", sparse] if sparse else []) + (["--data-dir", data_dir] if data_dir else [])
    if not (reuse and out.is_file()):
        call(args)
    return {(1.0 if r["method"] == "dense" else round(r["density"], 2)): r["ppl"] for r in json.loads(out.read_text())}


def reading(rows: list[dict]) -> str:
    """What the table decides, from its rows: the smallest sane density without a penalty, and whether
    greedy decoding loops where a penalty would then be the remedy."""
    greedy = [r for r in rows if r["repetition_penalty"] == 1.0]
    sane = [r["density"] for r in greedy if r["sane"] == "yes" and r["density"] < 1]
    looping = [f"{r['density']:g}" for r in greedy if r["loops"] != f"0/{len(QUESTIONS)}"]
    dense = next((r for r in greedy if r["density"] == 1.0), None)
    cured = sorted({f"{r['repetition_penalty']:g}" for r in rows
                    if r["repetition_penalty"] != 1.0 and r["sane"] == "yes" and r["density"] < 1})
    return (f"Reading: the smallest density whose greedy answers are sane is "
            f"{f'{min(sane):g}' if sane else 'none of those measured'}"
            + (f" ({next(r['ppl_vs_dense'] for r in greedy if r['density'] == min(sane))} perplexity against dense)"
               if sane else "")
            + f". Greedy answers loop at ρ {', '.join(looping) if looping else 'none'}"
            + (f"; the dense bundle's {'do' if dense['loops'] != f'0/{len(QUESTIONS)}' else 'do not'}" if dense else "")
            + (f". A repetition penalty makes some sparse row sane at {', '.join(cured)}." if cured
               else ". No repetition penalty measured makes a sparse row sane that greedy leaves insane."))


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")[:120] or "(nothing)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--densities", default="0.5,0.6,0.7,0.8,1")
    ap.add_argument("--repetition-penalties", default="1", help="comma list; 1 = off (the runtime's default)")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--data-dir", help="folder with wikitext-2-raw/")
    ap.add_argument("--work", type=Path, default=Path("/tmp/dipdeploy-default-density"), help="bundles (not in git)")
    ap.add_argument("--reuse", action="store_true", help="keep the bundles, perplexities and answers already in --work")
    ap.add_argument("--json", help="write the rows as a JSON list")
    args = ap.parse_args()
    densities = [float(d) for d in args.densities.split(",")]
    penalties = [float(p) for p in args.repetition_penalties.split(",")]
    args.work.mkdir(parents=True, exist_ok=True)
    from dipdeploy.paths import write_atomic

    ppl = perplexities(densities, args.windows, args.seqlen, args.data_dir, args.work, args.reuse)
    got, commands = {}, []
    for rho in densities:
        bundle = args.work / f"rho-{rho:g}"
        ex = export_args(rho, bundle, args.data_dir)
        commands.append(shlex.join(["dipdeploy", *ex]))
        if not (args.reuse and (bundle / "manifest.json").is_file()):
            t0 = time.perf_counter()
            call(ex)
            print(f"exported ρ {rho:g} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        for penalty in penalties:
            got[rho, penalty] = [ask(bundle, q, penalty, args.work / f"answer-{rho:g}-{penalty:g}-{i}.json", args.reuse)
                                 for i, (q, _) in enumerate(QUESTIONS)]
    rows, answers = [], []
    for (rho, penalty), said in got.items():
        dense = got.get((1.0, penalty))
        judged = [judge(g["text"], g["finish"], check, None if dense is None else dense[i]["text"])
                  for i, (g, (_, check)) in enumerate(zip(said, QUESTIONS))]
        p = ppl.get(round(rho, 2))
        count = lambda key: f"{sum(j[key] for j in judged)}/{len(judged)}"  # noqa: E731
        rows.append({"density": rho, "repetition_penalty": penalty, "ppl": p,
                     "ppl_vs_dense": None if p is None or 1.0 not in ppl else f"{100 * (p / ppl[1.0] - 1):+.1f} %",
                     "right": count("right"), "as_dense": count("as_dense"), "ends": count("ends"),
                     "loops": count("loops"), "sane": "yes" if all(j["sane"] for j in judged) else "no"})
        answers += [{"density": rho, "repetition_penalty": penalty, "question": q, "answer": cell(g["text"]),
                     "finish": g["finish"], **{k: "yes" if v else "no" for k, v in j.items()}}
                    for (q, _), g, j in zip(QUESTIONS, said, judged)]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    m = machine()
    eval_cmd = (f"dipdeploy eval --model {MODEL} --method dense,dip-ca --quant bq4 --density "
                f"{','.join(f'{d:g}' for d in densities if d < 1)} --max-windows {args.windows} --seqlen {args.seqlen}")
    text = (
        "# Export's default density on SmolLM2-135M-Instruct (benchmarks/default_density.py)\n\n"
        f"`python benchmarks/default_density.py {' '.join(shlex.quote(a) for a in sys.argv[1:])}` · commit "
        f"{commit} · {time.strftime('%Y-%m-%d')} · {lscpu()} · {m}\n\n"
        + ("With `--reuse` the bundles, answers and perplexities that `--work` held were kept: measured by an "
           "earlier run of this script with the same flags, on this machine.\n\n" if args.reuse else "")
        + "Conditions: bundles exported as the README's quickstart (`--method dip-ca --quant bq4`, split ρ_in "
        "calibrated, γ and cache the defaults; ρ 1 is `--method dip --density 1 --rho-in 1`: every row, the "
        "dense model through the same runtime); each question asked with `dipdeploy run BUNDLE --chat -p "
        f"QUESTION -n {MAX_NEW_TOKENS} --repetition-penalty P` (greedy, the default DRAM budget and policy). "
        "`right`: the answer holds what was asked (the first three planets it names are Mercury, Venus and "
        "Earth; 100; among its first 15 words one ending in -at other than cat, that, what); `as_dense`: the "
        "same text as the ρ 1 bundle's at the same penalty; `ends`: the model ended it (EOS) within the "
        "tokens; `loops`: it ends in one piece of text said over and over, or 30 characters of it come back "
        "three times; `sane`: every answer ends without looping and is right wherever the dense one is. "
        f"Perplexity: WikiText-2 test, {args.windows} × {args.seqlen} tokens, `{eval_cmd}` (the torch reference "
        "of the same plans and BQ4 weights; ρ 1 is its dense row).\n\n"
        "Exports:\n\n" + "\n".join(f"    {c}" for c in commands) + "\n\n"
        + md_table(rows, ["density", "repetition_penalty", "ppl", "ppl_vs_dense", "right", "as_dense", "ends",
                          "loops", "sane"])
        + "\n\n" + reading(rows) + "\n\n## The answers\n\n"
        + md_table(answers, ["density", "repetition_penalty", "question", "answer", "finish", "right", "as_dense",
                             "loops", "sane"]) + "\n")
    write_atomic(RESULTS, text, force=True)
    write_rows_json(rows + answers, args.json)
    print(text)


if __name__ == "__main__":
    main()
