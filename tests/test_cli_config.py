"""``run`` and ``chat`` build ``EngineConfig`` and ``Sampler`` by field name from their options
(dipdeploy/cli/run.py), so every field is an option of the same name and default, or is listed here."""

import dataclasses

import pytest
import typer
from typer.testing import CliRunner

from dipdeploy.cli import app
from dipdeploy.cli.run import engine_config
from dipdeploy.runtime.config import EngineConfig, FieldError
from dipdeploy.runtime.sampler import Sampler

#: EngineConfig fields set from an option of another name (a trace's row counts)
OTHER_NAME = {"pinned_counts": "pin_from"}
#: EngineConfig fields no option of the command sets: the library's own switches (benchmarks, tests)
NOT_OPTIONS = {
    "run": {"native_cache", "shared_staging", "overlap_reads"},
    "chat": {"native_cache", "shared_staging", "overlap_reads", "cold", "verify", "pinned_counts"},
}


#: fields whose option has another default: without --seed the CLI draws a seed (shown, kept in --json),
#: where a library caller's Sampler keeps its fixed one
CLI_DEFAULTS = {"seed": None}


def _params(name: str) -> dict:
    return {p.name: p for p in typer.main.get_command(app).commands[name].params}


def _fields(cls) -> dict:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


@pytest.mark.parametrize("command", ["run", "chat"])
def test_every_config_field_is_an_option_or_listed(command):
    params = _params(command)
    reached = {f for f in _fields(EngineConfig) if f in params or OTHER_NAME.get(f) in params}
    assert set(_fields(EngineConfig)) - reached == NOT_OPTIONS[command]
    assert not NOT_OPTIONS[command] & reached  # a listed field that became an option: drop it from the list
    assert set(_fields(Sampler)) <= set(params)  # every generation option


@pytest.mark.parametrize("command", ["run", "chat"])
def test_option_defaults_and_names_are_the_fields(command):
    params = _params(command)
    for cls in (EngineConfig, Sampler):
        for name, f in _fields(cls).items():
            if name not in params:
                continue
            default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
            if name == "stop":  # a repeatable option: None for none given, the field's empty tuple
                assert params[name].default is None and default == ()
                continue
            assert params[name].default == CLI_DEFAULTS.get(name, default), (command, name)
            # a refused field is reported under this name (FieldError.named)
            assert params[name].opts[0] == "--" + name.replace("_", "-"), (command, name)


def test_the_config_is_built_by_field_name():
    options = {"dram_budget": "30%", "policy": "lru", "io_gap": 3, "prefill_chunk": 16, "threads": 2,
               "flash_bandwidth": "1GB/s", "pin_from": None, "prompt": "ignored", "max_new_tokens": 5}
    cfg = engine_config(options)
    assert (cfg.dram_budget, cfg.policy, cfg.io_gap, cfg.prefill_chunk, cfg.threads) == ("30%", "lru", 3, 16, 2)
    assert cfg.flash_bandwidth == 1e9 and cfg.pinned_counts is None
    assert cfg.context == EngineConfig.context  # not given: the config's default


@pytest.mark.parametrize("field, value, config_says, cli_says", [
    ("io_gap", -1, "io gap must be >= 0 blocks, got -1", "--io-gap must be >= 0 blocks, got -1"),
    ("thread_pool", "global", "thread pool global: choose one of", "--thread-pool global: choose one of"),
    ("accuracy_level", 2, "accuracy level must be 0", "--accuracy-level must be 0"),
])
def test_one_check_two_names(field, value, config_says, cli_says):
    with pytest.raises(FieldError, match=config_says):
        EngineConfig(**{field: value})
    with pytest.raises(ValueError, match=cli_says):
        engine_config({field: value})


def test_the_cli_reports_the_configs_check_under_the_option(tmp_path):
    res = CliRunner().invoke(app, ["run", str(tmp_path), "-p", "x", "--io-threads", "0"])
    assert res.exit_code == 2 and "--io-threads must be >= 1, got 0" in res.output
    assert "Traceback" not in res.output
