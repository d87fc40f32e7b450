"""Each default is defined once (docs/design.md §1): a CLI option's default is its config field's default,
and configs that share a concept read it from the one that owns it."""

import dataclasses

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
NO_CONFIG = {"models", "inspect", "devices", "build-ops", "quantize"}


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
