"""Greedy decode of a dipdeploy bundle in onnxruntime-genai's own loop: ``og.Model`` reads the bundle's
``genai_config.json`` (which names ``model.onnx`` and, as ``custom_ops_library``, the bundle's native op
library), so this is the bundle as an onnxruntime-genai user runs it (README, "The bundle"). onnxruntime-genai
runs that library's code unchecked: on a bundle you did not export, run ``dipdeploy inspect BUNDLE --verify``
first (it holds the library to the builds dipdeploy knows).

Run it with a Python that has onnxruntime-genai, in a venv of its own (its onnxruntime pin may differ
from the one dipdeploy is installed with):

    python3 -m venv venv-genai && venv-genai/bin/pip install onnxruntime-genai
    venv-genai/bin/python scripts/genai_decode.py BUNDLE --prompt "The capital of France is" -n 64

``--threads N`` overlays ``intra_op_num_threads`` on the bundle's session options (the config as
shipped leaves ORT's default, every core), so it can run under the host runtime's thread count.
``--profile PREFIX`` overlays ORT's profiler on the decoder session (``enable_profiling``): the file,
``PREFIX_<date>.json``, is written when the model is released (benchmarks/kernel_gap.py reads it).

Prints the load and prefill seconds, decode tokens/s (and the decode's CPU seconds) (the ``generate_next_token`` calls after the
prompt), the peak RSS and the generated text.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import onnxruntime_genai as og


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("-n", "--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, help="intra-op threads (default: the bundle's config, ORT's default)")
    ap.add_argument("--profile", metavar="PREFIX", help="ORT's profiler on the decoder session, into PREFIX_*.json")
    args = ap.parse_args()
    t0 = time.perf_counter()
    config = og.Config(args.bundle)
    options = {}
    if args.threads is not None:
        options.update(intra_op_num_threads=args.threads, inter_op_num_threads=1)
    if args.profile:
        options["enable_profiling"] = args.profile
    if options:
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    model = og.Model(config)
    tokenizer = og.Tokenizer(model)
    load_s = time.perf_counter() - t0
    ids = tokenizer.encode(args.prompt)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(ids) + args.new_tokens)
    generator = og.Generator(model, params)
    t0 = time.perf_counter()
    generator.append_tokens(ids)
    prefill_s = time.perf_counter() - t0
    out, t0, c0 = [], time.perf_counter(), time.process_time()
    while not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    decode_s, decode_cpu = time.perf_counter() - t0, time.process_time() - c0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"load {load_s:.1f} s, prompt {len(ids)} tokens, prefill {prefill_s:.2f} s")
    print(f"decode {len(out)} tokens in {decode_s:.2f} s = {len(out) / decode_s:.2f} tok/s (CPU {decode_cpu:.2f} s); "
          f"peak RSS {rss_mb:.0f} MB")
    print("text:", repr(tokenizer.decode(out)))
    del generator, model  # the profile is written when the session is released


if __name__ == "__main__":
    main()
