"""Each default is defined once (docs/design.md §1): a CLI option's default is its config field's default,
and configs that share a concept read it from the one that owns it."""

import dataclasses
import inspect

import pytest
import typer

from dipdeploy import defaults
from dipdeploy.cli import app
from dipdeploy.demo import DemoConfig
from dipdeploy.eval import EvalConfig
from dipdeploy.export.config import ExportConfig
from dipdeploy.finetune.config import LoraConfig
from dipdeploy.registry import ModelSpec
from dipdeploy.runtime.budget import DramBudget
from dipdeploy.runtime.config import EngineConfig
from dipdeploy.runtime.sampler import Sampler
from dipdeploy.sim import SimConfig
from dipdeploy.sparsity.plan import SparsityConfig

# The config dataclasses whose fields each command's options set (same name = same knob).
CONFIGS = {
    "eval": (EvalConfig, SparsityConfig),
    "calibrate": (SparsityConfig,),
    "trace": (SparsityConfig,),
    "demo": (DemoConfig,),
    "finetune": (LoraConfig, SparsityConfig),
    "export": (ExportConfig,),
    "run": (EngineConfig, Sampler),
    "chat": (EngineConfig, Sampler),
    "simulate": (SimConfig,),
}
# Options named differently from the value they default to.
RENAMED = {("calibrate", "windows"): defaults.CALIB_WINDOWS, ("calibrate", "seqlen"): defaults.CALIB_SEQLEN,
           ("demo", "density"): ",".join(f"{d:g}" for d in DemoConfig.densities)}
# Commands with no config dataclass of their own (their options are their own).
NO_CONFIG = {"models", "inspect", "devices", "build-ops", "quantize", "bench"}  # bench: its grid's bounds and defaults are dipdeploy.bench.grid's


def _commands():
    return typer.main.get_command(app).commands


def _field_defaults(classes) -> dict:
    out = {}
    for cls in reversed(classes):  # the first class wins a shared name
        out.update({f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING})
    return out


def _same(cli, field) -> bool:
    """A comma-list option (eval's --density "0.5") spells its field's scalar default as text."""
    if isinstance(cli, str) and not isinstance(field, str):
        try:
            return float(cli) == float(field)
        except (TypeError, ValueError):
            return False
    return cli == field


def test_every_command_is_mapped_to_its_configs():
    assert set(_commands()) == set(CONFIGS) | NO_CONFIG


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_cli_option_defaults_are_the_config_defaults(name):
    fields = _field_defaults(CONFIGS[name])
    checked, wrong = 0, []
    for p in _commands()[name].params:
        want = RENAMED.get((name, p.name), fields.get(p.name, dataclasses.MISSING))
        if want is dataclasses.MISSING or p.default is None:  # None: unset, the config's default applies
            continue
        checked += 1
        if not _same(p.default, want):
            wrong.append(f"--{p.name.replace('_', '-')} {p.default!r} vs {want!r}")
    assert not wrong, f"{name}: option defaults differ from the config: {wrong}"
    assert checked or name in ("export", "simulate", "finetune")  # those pass only the flags given


def test_model_option_defaults_to_the_one_default_model():
    for name, cmd in _commands().items():
        for p in cmd.params:
            if p.name == "model" and p.default is not None and name != "simulate":
                assert p.default == defaults.MODEL, name
    assert EvalConfig.model == ExportConfig.model == defaults.MODEL


def test_configs_read_shared_defaults_from_their_owner():
    s = SparsityConfig()
    e, x, r = EvalConfig(), ExportConfig(), EngineConfig()
    assert (e.method, e.density) == ((s.method,), (s.density,))
    assert (x.method, x.density, x.gamma) == (s.method, s.density, s.gamma)
    assert (e.calib_windows, e.calib_seqlen) == (x.calib_windows, x.calib_seqlen) == (
        defaults.CALIB_WINDOWS, defaults.CALIB_SEQLEN)
    assert e.stats_windows == x.stats_windows == defaults.STATS_WINDOWS
    assert DramBudget.parse(r.dram_budget).cache_frac == s.cache_frac
    assert r.policy == s.policy
    assert SimConfig().gamma == s.gamma
    # the registry carries no sparsity defaults of its own (SparsityConfig's are the ones)
    assert "defaults" not in {f.name for f in dataclasses.fields(ModelSpec)}


def test_run_and_chat_share_the_context_default():
    cmds = _commands()
    ctx = {n: next(p.default for p in cmds[n].params if p.name == "context") for n in ("run", "chat")}
    assert ctx["run"] == ctx["chat"] == EngineConfig.context


def test_the_android_engine_defaults_are_generated_from_pythons():
    """Defaults.java copies Python's defaults (android_demo/make_defaults.py); a changed Python default
    with a stale Java copy fails here."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "android_demo" / "make_defaults.py"
    spec = importlib.util.spec_from_file_location("make_defaults", path)
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    assert make.TARGET.read_text() == make.render(), "run android_demo/make_defaults.py"
    # the engine's sources take these from Defaults, not from literals of their own
    src = make.TARGET.parent
    engine, cli = (src / "Engine.java").read_text(), (src / "Cli.java").read_text()
    for name in ("THREADS", "CONTEXT", "POLICY", "CACHE_FRAC", "CACHE_SPLIT"):
        assert f"Defaults.{name}" in engine, name
    for name in ("MAX_NEW_TOKENS", "TEMPERATURE", "TOP_P", "SEED"):
        assert f"Defaults.{name}" in cli, name


def test_completion_and_answer_lengths_are_defined_once():
    from dipdeploy.export.generate import generate
    from dipdeploy.runtime.chat import Chat

    params = {n: {p.name: p.default for p in c.params} for n, c in _commands().items()}
    assert params["run"]["max_new_tokens"] == params["inspect"]["max_new_tokens"] == defaults.MAX_NEW_TOKENS
    assert inspect.signature(generate).parameters["max_new_tokens"].default == defaults.MAX_NEW_TOKENS
    assert params["chat"]["max_new_tokens"] == defaults.CHAT_MAX_NEW_TOKENS
    assert inspect.signature(Chat.say).parameters["max_new_tokens"].default == defaults.CHAT_MAX_NEW_TOKENS


def test_a_plan_defaults_to_the_sparsity_configs_cache_and_scores():
    from dipdeploy.sparsity.plan import SparsityPlan

    plan = {f.name: f.default for f in dataclasses.fields(SparsityPlan)}
    config = {f.name: f.default for f in dataclasses.fields(SparsityConfig)}
    for name in ("score", "policy", "cache_frac", "cache_split", "fixed_top_n", "gamma_warmup", "allocation"):
        assert plan[name] == config[name], name


def test_the_default_density_is_defaults_and_export_help_says_it():
    """Export's default density is the product's choice (dipdeploy.defaults.DENSITY, docs/decisions/0007):
    every stage's SparsityConfig reads it, and `export --help` shows that figure, not one of its own."""
    from typer.testing import CliRunner

    assert SparsityConfig.density == ExportConfig.density == defaults.DENSITY
    assert EvalConfig().density == (defaults.DENSITY,)
    res = CliRunner().invoke(app, ["export", "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.replace("│", " ").split())
    assert f"MLP density ρ when no --plan (default {defaults.DENSITY:g})" in flat
