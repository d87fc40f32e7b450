"""The peers of benchmarks/flash.py's 1 B section: onnxruntime-genai's int4 export and llama.cpp (a Q4_0
GGUF, mmap), built from the same Hugging Face checkpoint and decoded, one process per configuration, in
the same cgroup v1 memory group and under the same limit as a DIP-CA run (benchmarks/results/flash.md).

Each peer lives in a venv of its own (onnxruntime-genai pins its own onnxruntime; llama-cpp-python is
built from source with an explicit instruction set), so this module's child half uses the standard
library and the peer's package only, and is started with the peer's interpreter:

    VENV/bin/python benchmarks/peers.py --child '{"peer": "llama.cpp", "model": "x.gguf", ...}'

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

The child drops the model files from the page cache (cgroup v1 charges a cached page to the group that
read it first, so pages cached by the build would escape the limit), loads the model, decodes a few warm-up tokens, asks the OS to forget the model files' cached
pages, sets the group's limit (``spec["limit"]`` bytes, or none), then times ``spec["tokens"]`` greedy
tokens and prints one JSON row: decode tok/s (the steps after the first token), device MB per decode
token (``/proc/self/io`` ``read_bytes`` over those steps, as flash.py's own child measures), the group's
peak charge, peak RSS. A limit below what the peer's anonymous memory already holds cannot be set (the
kernel has nothing to reclaim but the page cache): the row then says so instead of timing anything.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

#: The method names of the table's rows. llama.cpp runs twice: as it loads by default, where its CPU backend
#: repacks Q4_0 weights into interleaved blocks in anonymous memory (``use_extra_bufts``: a copy the kernel
#: cannot reclaim, so the model must fit in memory), and with the repacking off, computing from the mapped
#: file's pages, which the kernel can drop and read again (``--no-repack``, what a user whose model does
#: not fit in memory runs).
PEERS = ("onnxruntime-genai int4", "llama.cpp Q4_0 mmap", "llama.cpp Q4_0 mmap, no repack")
LLAMA_PEERS = PEERS[1:]
WARMUP = 4  # tokens decoded before the files are dropped and the limit set, as flash.py's child does


def read_bytes() -> int:
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


def set_limit(group: Path, limit: int | None) -> str | None:
    """Limit the group; the reason when the kernel refuses (EBUSY: the charge cannot be reclaimed below it)."""
    if limit is not None:
        try:
            (group / "memory.limit_in_bytes").write_text(str(limit))
        except OSError as err:
            if err.errno != errno.EBUSY:
                raise
            usage = int((group / "memory.usage_in_bytes").read_text())
            return (f"does not fit: the group holds {usage / 1e6:.0f} MB after loading and the kernel cannot "
                    f"reclaim it below the {limit / 1e6:.0f} MB limit")
    (group / "memory.max_usage_in_bytes").write_text("0")
    return None


class Timer:
    """Seconds and device bytes from the first generated token on (the decode steps)."""

    def start(self) -> None:
        self.t0, self.b0 = time.perf_counter(), read_bytes()

    def stop(self, steps: int) -> dict:
        seconds, device = time.perf_counter() - self.t0, read_bytes() - self.b0
        return {"wall_tok_s": steps / seconds, "device_mb": device / steps / 1e6}


def limited_decode(decode, files: list[Path], group: Path, spec: dict) -> dict:
    """Warm up, drop the model files from the page cache, set the group's limit, then time
    ``spec["tokens"]`` decode steps (``decode(n, on_first)`` returns the steps it made after the first
    token); ``{"error": …}`` when the limit cannot be set."""
    decode(WARMUP)
    drop_files(files)
    refused = set_limit(group, spec["limit"])
    if refused:
        return {"error": refused}
    timer = Timer()
    steps = decode(spec["tokens"], timer.start)
    return timer.stop(steps)


def genai_child(spec: dict, group: Path) -> dict:
    import onnxruntime_genai as og

    files = sorted(Path(spec["model"]).glob("*.onnx*"))
    drop_files(files)  # cold, and the pages it reads are charged to this group
    config = og.Config(spec["model"])
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": spec["threads"], "inter_op_num_threads": 1}}}}))
    model = og.Model(config)
    tokenizer = og.Tokenizer(model)
    ids = tokenizer.encode(spec["prompt"])

    def decode(n: int, on_first=None) -> int:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + n)
        gen = og.Generator(model, params)
        gen.append_tokens(ids)
        gen.generate_next_token()  # the first token: the prompt's logits, computed by append_tokens
        if on_first:
            on_first()
        steps = 0
        while not gen.is_done():
            gen.generate_next_token()
            steps += 1
        return steps

    row = limited_decode(decode, files, group, spec)
    return row if "error" in row else {**row, "tok_s": row["wall_tok_s"]}


def llama_child(spec: dict, group: Path) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    if spec["peer"] == PEERS[2]:  # Llama() takes its model parameters from this function: no repack
        defaults = llama_cpp.llama_cpp.llama_model_default_params

        def no_repack():
            params = defaults()
            params.use_extra_bufts = False
            return params

        llama_cpp.llama_cpp.llama_model_default_params = no_repack

    # v1 charges a cached page to the group that first read it: dropped first, the model's pages fault in
    # charged to this group, so its limit can evict them (and starts cold)
    drop_files([Path(spec["model"])])
    llm = Llama(spec["model"], n_ctx=256, n_threads=spec["threads"], n_threads_batch=spec["threads"],
                use_mmap=True, verbose=False)
    ids = llm.tokenize(spec["prompt"].encode())

    def decode(n: int, on_first=None) -> int:
        llm.reset()
        steps = -1
        for _ in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            steps += 1
            if steps == 0:
                if on_first:
                    on_first()
                llama_cpp.llama_perf_context_reset(llm.ctx)  # its timings count the decode steps only
            if steps + 1 == n:
                break
        return steps

    row = limited_decode(decode, [Path(spec["model"])], group, spec)
    if "error" in row:
        return row
    perf = llama_cpp.llama_perf_context(llm.ctx)  # llama.cpp's own eval timer: n_eval tokens in t_eval_ms
    row["tok_s"] = perf.n_eval / (perf.t_eval_ms / 1e3) if perf.t_eval_ms > 0 else None
    row["n_eval"] = perf.n_eval
    return row


def child(spec: dict) -> dict:
    group = Path(spec["group"])
    run = genai_child if spec["peer"] == PEERS[0] else llama_child
    row = run(spec, group)
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # KiB → MB
    if "error" not in row:
        row["peak_group_mb"] = int((group / "memory.max_usage_in_bytes").read_text()) / 1e6
    row["limit_mb"] = spec["limit"] / 1e6 if spec["limit"] else None
    return row


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


if __name__ == "__main__":
    if sys.argv[1:2] != ["--child"] or len(sys.argv) != 3:
        sys.exit("usage: peers.py --child SPEC_JSON (started by benchmarks/flash.py --model llama-1b)")
    print(json.dumps(child(json.loads(sys.argv[2]))))
