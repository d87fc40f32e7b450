"""The peers of benchmarks/flash.py's 1 B section: onnxruntime-genai's int4 export and llama.cpp (a Q4_0
GGUF, mmap), built from the same Hugging Face checkpoint; the build helpers and flash.py's names for them.

Each peer lives in a venv of its own (onnxruntime-genai pins its own onnxruntime; llama-cpp-python is
built from source with an explicit instruction set). They are run by the child of ``dipdeploy bench
decode --peer`` (dipdeploy/bench/peer_child.py: the standard library and the peer's package only, started
by path with the peer's interpreter), which flash.py starts too:

    VENV/bin/python -I dipdeploy/bench/peer_child.py '{"peer": "llama.cpp", "model": "x.gguf", ...}'

How the peers of benchmarks/results/flash.md were built (x86-64, AVX-512 listed by lscpu):

- onnxruntime-genai 0.18.0 (onnxruntime 1.32.0) in its own venv, plus torch, transformers and onnx_ir for
  its builder; ``python -m onnxruntime_genai.models.builder -i CHECKPOINT -o OUT -p int4 -e cpu -c CACHE``
  (:func:`build_genai`): MatMulNBits int4, its own defaults otherwise.
- llama-cpp-python 0.3.36 from the sdist (``pip download llama-cpp-python --no-deps --no-binary :all:``)
  into a venv of the same base interpreter, ``CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON
  -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
  -DLLAVA_BUILD=OFF"`` (an explicit instruction set: a native build can die with "Illegal instruction"
  on another host; on the AMD EPYC of results/flash-1b-levels.md, which has AVX2 but no AVX-512, the same
  flags without the three AVX512 ones); gguf 0.19.0, torch, transformers and sentencepiece for the
  converter (its Llama class imports sentencepiece before it tries the checkpoint's BPE tokenizer). The
  sdist's ``vendor/llama.cpp/convert_hf_to_gguf.py`` writes a bf16 GGUF, ``llama_model_quantize`` makes Q4_0
  (the embedding Q6_K, as llama.cpp chooses) (:func:`build_gguf`).

What the child does (drop the model's files from the page cache, load, warm up, set the group's limit,
time the tests) is in its docstring. A limit below what the peer's anonymous memory already holds cannot
be set (the kernel has nothing to reclaim but the page cache): the run then says so instead of timing
anything.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from dipdeploy.bench.peer_child import read_bytes  # noqa: F401  (flash.py's and io_auto.py's children read it here)
from dipdeploy.bench.peers import child_argv  # noqa: F401  (flash.py starts the peers' child with it)

#: The method names of the table's rows. llama.cpp runs twice: as it loads by default, where its CPU backend
#: repacks Q4_0 weights into interleaved blocks in anonymous memory (``use_extra_bufts``: a copy the kernel
#: cannot reclaim, so the model must fit in memory), and with the repacking off, computing from the mapped
#: file's pages, which the kernel can drop and read again (``--no-repack``, what a user whose model does
#: not fit in memory runs).
PEERS = ("onnxruntime-genai int4", "llama.cpp Q4_0 mmap", "llama.cpp Q4_0 mmap, no repack")
LLAMA_PEERS = PEERS[1:]
#: each row's peer as the child names it (``dipdeploy.bench.peer_child.PEERS``)
CHILD_PEER = dict(zip(PEERS, ("genai", "llama.cpp", "llama.cpp-no-repack")))
PEER_WARMUP = 4  # flash.py's peers' warm-up prompt, in tokens
PEER_CONTEXT = 256  # flash.py's peers' context, in positions


def peer_spec(method: str, model: Path, prompt: str, tokens: int, limit: int | None) -> dict:
    """The peer child's spec for one of flash.py's rows: ``tokens`` decode steps (its tg test) after a
    warm-up on ``prompt``, one thread, the model's files dropped after the warm-up (cold), the limit set
    after the load."""
    return {"peer": CHILD_PEER[method], "model": str(model), "text": prompt, "tests": [["tg", tokens]],
            "warmup": PEER_WARMUP, "context": max(PEER_CONTEXT, tokens + 2), "threads": 1, "cold": True,
            "limit": limit}


def peer_row(reply: dict, spec: dict) -> dict:
    """The peer child's reply as flash.py's row: decode tok/s, device MB per decode token, the group's
    peak over the decode, peak RSS and the limit; ``error`` where the limit could not be set."""
    limit_mb = spec["limit"] / 1e6 if spec["limit"] else None
    if reply.get("status") != "ok":
        return {"error": reply.get("error") or reply.get("why", "no reply"), "limit_mb": limit_mb}
    s = reply["samples"][f"tg{spec['tests'][0][1]}"]
    return {"tok_s": s["tok_s"], "device_mb": s["device_mb_per_token"], "peak_group_mb": s["cgroup_peak_mb"],
            "peak_rss_mb": reply.get("peak_rss_mb"), "limit_mb": limit_mb}


def build_genai(python: str, checkpoint: Path, out: Path) -> None:
    """onnxruntime-genai's own builder: int4 (MatMulNBits), CPU, from the local checkpoint folder. Run from
    build/: ``python -m`` puts the working folder first on the import path, where no module of ours belongs."""
    cache = out.with_name(out.name + ".cache")
    subprocess.run([python, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(out),
                    "-p", "int4", "-e", "cpu", "-c", str(cache)], check=True, cwd=out.parent)


def build_gguf(python: str, convert: Path, checkpoint: Path, out: Path) -> None:
    """llama.cpp's convert_hf_to_gguf.py (bf16 GGUF), then llama_model_quantize to Q4_0, written to a
    temporary name and renamed in."""
    bf16 = out.with_name(out.stem + "-bf16.gguf")
    if not bf16.is_file():
        subprocess.run([python, str(convert), str(checkpoint), "--outtype", "bf16", "--outfile", str(bf16)],
                       check=True, cwd=out.parent)
    tmp = out.with_name(out.name + ".tmp")
    quantise = ("import sys, llama_cpp as l; p = l.llama_model_quantize_default_params(); "
                "p.ftype = l.LLAMA_FTYPE_MOSTLY_Q4_0; p.nthread = 2; "
                "sys.exit(l.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))")
    subprocess.run([python, "-c", quantise, str(bf16), str(tmp)], check=True, cwd=out.parent)
    tmp.replace(out)
