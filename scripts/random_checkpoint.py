"""Write a randomly initialised Hugging Face checkpoint with a real model's shapes, streamed, so that the
7B path of `dipdeploy export --stream` can be exercised without the hub (README, "Random checkpoints").

Its weights are random: perplexity, agreement and accuracy figures measured on it say nothing about the
trained model; only shapes, bytes, memory and time carry over. ``config.json`` says so in its
``dipdeploy_note`` field.

    python scripts/random_checkpoint.py --out build/mistral-7b-random            # the full 32 layers
    python scripts/random_checkpoint.py --out /tmp/m2 --layers 2 --json m2.json  # a cut, same shapes
    python scripts/random_checkpoint.py --out /tmp/t --config tiny/config.json   # any HF config.json
    python scripts/random_checkpoint.py --out build/llama-1b-random --config benchmarks/llama-1b.json \
        --tokenizer smollm2-135m                                                  # a real tokenizer

The config is the registry's ``mistral-7b`` (``dipdeploy/models/mistral-7b.toml``) plus the values that
file does not hold, taken from Mistral-7B-v0.1's published ``config.json`` (:data:`MISTRAL_7B_EXTRA`).
The layout is Hugging Face's: bf16 safetensors shards of at most :data:`SHARD_BYTES` named
``model-0000i-of-0000n.safetensors`` and ``model.safetensors.index.json``. Peak memory is about one
tensor (the embedding, 262 MB at 7B), never the model: the shard layout is planned from the shapes of a
model built on the ``meta`` device, each shard's safetensors header is written first, then each tensor
is generated (its own seeded generator), written and freed before the next one is made.

Initialisation follows HF's ``_init_weights``: Linear and Embedding weights N(0, ``initializer_range``),
biases 0, every other parameter (the RMSNorm weights) 1. Each tensor's generator is seeded from
``--seed`` and the tensor's name, so a ``--layers`` cut holds the same tensors as the full model.

The tokenizer is byte-level with exactly ``vocab_size`` tokens (Mistral's own layout of ids: ``<unk>``,
``<s>``, ``</s>``, then the 256 bytes, then unused ``<extra_i>`` fillers no text encodes to), so the
embedding and the tokenizer agree; the SmolLM2 tokenizer has 49152 tokens and would not fit 32000.
``--tokenizer`` (a registry name or an HF folder) saves that model's tokenizer instead, when its length
is the config's ``vocab_size``: tools that identify a tokenizer by its pre-tokenizer (llama.cpp's
``convert_hf_to_gguf.py``) refuse the byte-level one, and prompts then encode to real tokens.
"""

from __future__ import annotations

import argparse
import json
import resource
import struct
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

#: What ``mistral-7b.toml`` does not hold, from mistralai/Mistral-7B-v0.1's config.json.
MISTRAL_7B_EXTRA = {"rope_theta": 10000.0, "sliding_window": 4096, "rms_norm_eps": 1e-5, "hidden_act": "silu",
                    "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2}
REGISTRY_MODEL = "mistral-7b"
SHARD_BYTES = 5 * 10**9  # save_pretrained's default max_shard_size "5GB"
SPECIALS = ("<unk>", "<s>", "</s>")
NOTE = ("random weights written by dipdeploy scripts/random_checkpoint.py (seed {seed}), not the trained "
        "checkpoint: shapes, bytes and memory carry over, accuracy figures do not")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    init: str  # "normal" | "zeros" | "ones"

    @property
    def nbytes(self) -> int:
        n = 2  # bf16
        for s in self.shape:
            n *= s
        return n


@dataclass
class Report:
    out: str
    layers: int
    tensors: int
    total_bytes: int
    shards: list[dict]
    seconds: float
    peak_rss_bytes: int


def build_config(config_file: Path | None, layers: int | None):
    """The HF config to write: ``config_file``'s, or the registry's Mistral-7B with :data:`MISTRAL_7B_EXTRA`."""
    from transformers import AutoConfig

    if config_file is not None:
        raw = json.loads(config_file.read_text())
        if "model_type" not in raw:
            raise ValueError(f"--config {config_file} has no model_type; give a Hugging Face config.json")
        raw.pop("transformers_version", None)
        config = AutoConfig.for_model(**raw)
    else:
        from dipdeploy.registry import get_model

        spec = get_model(REGISTRY_MODEL)
        s = spec.shape
        config = AutoConfig.for_model(
            spec.arch.model_type, architectures=[spec.architecture], hidden_size=s.hidden_size,
            intermediate_size=s.intermediate_size, num_hidden_layers=s.num_hidden_layers,
            num_attention_heads=s.num_attention_heads, num_key_value_heads=s.num_key_value_heads,
            head_dim=s.head_dim, vocab_size=s.vocab_size, max_position_embeddings=s.max_position_embeddings,
            tie_word_embeddings=s.tie_word_embeddings, **MISTRAL_7B_EXTRA)
    if layers is not None:
        config.num_hidden_layers = layers
    config.dtype = "bfloat16"
    return config


def tensor_specs(config) -> list[TensorSpec]:
    """Every parameter of the model, in its state-dict order, with HF's init rule (built on ``meta``)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    out, seen = [], set()
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen:  # a tied head shares the embedding: saved once, as HF does
                continue
            seen.add(id(p))
            name = f"{mname}.{pname}" if mname else pname
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                init = "normal" if pname == "weight" else "zeros"
            else:
                init = "ones"
            out.append(TensorSpec(name, tuple(p.shape), init))
    return out


def plan_shards(specs: list[TensorSpec], shard_bytes: int = SHARD_BYTES) -> list[list[TensorSpec]]:
    """Consecutive tensors grouped into shards of at most ``shard_bytes`` (a larger tensor gets its own)."""
    shards, cur, size = [], [], 0
    for s in specs:
        if cur and size + s.nbytes > shard_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(s)
        size += s.nbytes
    if cur:
        shards.append(cur)
    return shards


def tensor_seed(seed: int, name: str) -> int:
    return (seed * 0x9E3779B1 + zlib.crc32(name.encode())) % 2**63


def make_tensor(spec: TensorSpec, seed: int, std: float):
    """One tensor, generated in bf16 from its own generator (nothing else is held)."""
    import torch

    t = torch.empty(spec.shape, dtype=torch.bfloat16)
    if spec.init == "normal":
        g = torch.Generator().manual_seed(tensor_seed(seed, spec.name))
        t.normal_(0.0, std, generator=g)
    else:
        t.fill_(1.0 if spec.init == "ones" else 0.0)
    return t


def safetensors_header(specs: list[TensorSpec]) -> bytes:
    """The safetensors header (8-byte length + JSON, padded to 8 bytes) for tensors laid out in order."""
    meta, off = {"__metadata__": {"format": "pt"}}, 0
    for s in specs:
        meta[s.name] = {"dtype": "BF16", "shape": list(s.shape), "data_offsets": [off, off + s.nbytes]}
        off += s.nbytes
    body = json.dumps(meta, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body


def write_tensor(f, tensor) -> None:
    """Append one tensor's bytes (bf16 viewed as int16: numpy has no bf16; no copy)."""
    import torch

    f.write(memoryview(tensor.view(torch.int16).numpy()).cast("B"))


def byte_tokenizer(vocab_size: int):
    """A byte-level tokenizer with exactly ``vocab_size`` tokens (see the module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    need = len(SPECIALS) + len(alphabet)
    if vocab_size < need:
        raise ValueError(f"vocab_size {vocab_size} is below the {need} tokens a byte-level tokenizer needs; "
                         f"give a config with vocab_size >= {need}")
    vocab = {t: i for i, t in enumerate([*SPECIALS, *alphabet])}
    vocab.update({f"<extra_{i}>": need + i for i in range(vocab_size - need)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=SPECIALS[0]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=SPECIALS[0], bos_token=SPECIALS[1],
                                   eos_token=SPECIALS[2])


def named_tokenizer(name_or_path: str, vocab_size: int):
    """The tokenizer of a registry model or HF folder, refused unless it has exactly ``vocab_size`` tokens."""
    from transformers import AutoTokenizer

    from dipdeploy.loading import resolve

    tok = AutoTokenizer.from_pretrained(resolve(name_or_path)[0])
    if len(tok) != vocab_size:
        raise ValueError(f"--tokenizer {name_or_path} has {len(tok)} tokens but the config's vocab_size is "
                         f"{vocab_size}; give a config with vocab_size {len(tok)} or another tokenizer")
    return tok


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def write_checkpoint(out: Path, *, config_file: Path | None = None, layers: int | None = None, seed: int = 0,
                     force: bool = False, shard_bytes: int = SHARD_BYTES, tokenizer: str | None = None) -> Report:
    """Write the checkpoint into a temporary sibling of ``out`` and rename it in (the overwrite rule)."""
    from dipdeploy.paths import atomic_dir, check_output

    check_output(out, force, directory=True, flag="--out")
    if layers is not None and layers < 1:
        raise ValueError(f"--layers {layers}: give at least 1")
    t0 = time.perf_counter()
    config = build_config(config_file, layers)
    config.dipdeploy_note = NOTE.format(seed=seed)
    std = float(getattr(config, "initializer_range", 0.02))
    tok = byte_tokenizer(config.vocab_size) if tokenizer is None else named_tokenizer(tokenizer, config.vocab_size)
    specs = tensor_specs(config)
    shards = plan_shards(specs, shard_bytes)
    n = len(shards)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)] if n > 1 else ["model.safetensors"]
    with atomic_dir(out) as tmp:
        for fname, group in zip(names, shards):
            with open(tmp / fname, "wb") as f:
                f.write(safetensors_header(group))
                for spec in group:
                    tensor = make_tensor(spec, seed, std)
                    write_tensor(f, tensor)
                    del tensor
        if n > 1:
            index = {"metadata": {"total_size": sum(s.nbytes for s in specs)},
                     "weight_map": {s.name: fname for fname, g in zip(names, shards) for s in g}}
            (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    shard_rows = [{"file": fname, "bytes": (out / fname).stat().st_size, "tensors": len(g)}
                  for fname, g in zip(names, shards)]
    return Report(str(out), config.num_hidden_layers, len(specs), sum(s.nbytes for s in specs), shard_rows,
                  round(time.perf_counter() - t0, 1), peak_rss_bytes())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    ap.add_argument("--config", type=Path, help="an HF config.json to take instead of the registry's Mistral-7B")
    ap.add_argument("--layers", type=int, help="write only the first N decoder layers (same shapes)")
    ap.add_argument("--tokenizer", help="save this registry model's or HF folder's tokenizer (its size must be "
                    "vocab_size) instead of the byte-level one")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write sizes, seconds and peak RSS here")
    ap.add_argument("--force", action="store_true", help="replace an existing --out / --json")
    args = ap.parse_args(argv)
    from dipdeploy.paths import check_input_file, check_outputs, write_atomic

    try:
        check_input_file(args.config, "--config")
        check_outputs(args.force, {"--json": args.json})
        report = write_checkpoint(args.out, config_file=args.config, layers=args.layers, seed=args.seed,
                                  force=args.force, tokenizer=args.tokenizer)
    except (ValueError, OSError, KeyError) as err:  # FileNotFoundError (an unknown --tokenizer) is an OSError
        text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
        print(f"error: {' '.join(text.split())}", file=sys.stderr)
        return 2
    if args.json is not None:
        write_atomic(args.json, json.dumps(asdict(report), indent=1), force=args.force)
    print(f"{report.out}: {report.layers} layers, {report.tensors} tensors, {report.total_bytes / 1e9:.2f} GB "
          f"in {len(report.shards)} shard(s), {report.seconds} s, peak RSS {report.peak_rss_bytes / 1e6:.0f} MB "
          f"(random weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
