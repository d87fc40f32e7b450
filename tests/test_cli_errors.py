"""Whatever a command lets escape ends as one line naming the cause and the fix, with no traceback unless
``--debug`` (or ``DIPDEPLOY_DEBUG=1``) asks for it (dipdeploy/cli/errors.py through ``_Group`` in _app.py).

Each case makes the stage function of `dipdeploy models` (the registry listing: no try of its own, so
every exception escapes it) raise one class the issue lists, and checks the line, the exit code and that
the traceback appears only when asked for.
"""

from __future__ import annotations

import errno
import struct
import zipfile

import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import Fail, InvalidArgument, RuntimeException
from safetensors import SafetensorError
from typer.testing import CliRunner

import dipdeploy.cli.core
from dipdeploy.cli import app

runner = CliRunner()


class PanicException(BaseException):
    """pyo3's panic (tokenizers, safetensors) derives from BaseException, not Exception."""


def _struct_error() -> struct.error:
    try:
        struct.unpack("<Q", b"\x01\x02")
    except struct.error as err:
        return err


# (id, the exception, the exit code, texts the line must hold)
CASES = [
    ("ort-fail", Fail("[ONNXRuntimeError] : 1 : FAIL : Load model from model.onnx failed: Protobuf parsing failed"),
     2, ["onnxruntime refused", "Protobuf parsing failed", "dipdeploy inspect BUNDLE --verify"]),
    ("ort-invalid-argument", InvalidArgument("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions"),
     2, ["onnxruntime refused", "InvalidArgument: Got invalid dimensions"]),
    ("ort-runtime", RuntimeException("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code"), 1,
     ["onnxruntime failed while running", "--debug"]),
    ("utf8-decode", UnicodeDecodeError("utf-8", b"ab\xffcd", 2, 3, "invalid start byte"), 2,
     ["not valid UTF-8", "b'\\xff' at offset 2", "iconv"]),
    ("utf8-encode", UnicodeEncodeError("utf-8", "hi \udcff", 3, 4, "surrogates not allowed"), 2,
     ["not valid UTF-8", "LANG=C.UTF-8"]),
    ("struct", _struct_error(), 2, ["ended early", "unpack requires a buffer of 8 bytes", "create it again"]),
    ("tokenizer-json", Exception("data did not match any variant of untagged enum ModelUntagged at line 1 column 41"),
     2, ["a tokenizer file could not be read", "ModelUntagged", "tokenizer.json"]),
    ("safetensors", SafetensorError("Error while deserializing header: HeaderTooLarge"), 2,
     ["a .safetensors file is damaged", "HeaderTooLarge"]),
    ("zip", zipfile.BadZipFile("File is not a zip file"), 2, ["damaged or truncated", "dipdeploy trace"]),
    ("enospc", OSError(errno.ENOSPC, "No space left on device", "/data/out.json"), 1,
     ["No space left on device: /data/out.json", "free space"]),
    ("eacces", PermissionError(errno.EACCES, "Permission denied", "/etc/x.json"), 1,
     ["Permission denied: /etc/x.json", "permissions"]),
    ("os-other", OSError(errno.EXDEV, "Invalid cross-device link", "/a", None, "/b"), 1,
     ["Invalid cross-device link: /a → /b", "--debug"]),
    ("memory", MemoryError(), 1, ["memory ran out", "memory.max", "--dram-budget"]),
    ("panic", PanicException("called `Option::unwrap()` on a `None` value"), 1,
     ["PanicException", "unwrap", "--debug"]),
    ("internal", ZeroDivisionError("division by zero"), 1, ["internal error (ZeroDivisionError: division by zero)",
                                                            "rerun with --debug for the traceback"]),
    ("hostile-text", RuntimeError("bad \x1b]52;c;ZXZpbA==\x07 [/bold]\nsecond line"), 1,
     ["\\x1b]52", "[/bold]", "second line"]),
]


@pytest.fixture
def raising(monkeypatch):
    def arm(err: BaseException):
        def stage():
            raise err

        monkeypatch.setattr(dipdeploy.cli.core, "list_models", stage)

    return arm


@pytest.mark.parametrize("err, code, texts", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_one_line_with_the_cause_and_no_traceback(raising, err, code, texts, monkeypatch):
    monkeypatch.delenv("DIPDEPLOY_DEBUG", raising=False)
    raising(err)
    res = runner.invoke(app, ["models"])
    out = res.output.strip()
    assert res.exit_code == code, out
    assert len(out.splitlines()) == 1 and out.startswith("error: "), out
    assert "Traceback" not in out and "\x1b" not in out and isinstance(res.exception, SystemExit), out
    for text in texts:
        assert text in out, (text, out)


@pytest.mark.parametrize("how", ["--debug", "DIPDEPLOY_DEBUG=1"])
def test_debug_shows_the_traceback_and_keeps_the_line(raising, how, monkeypatch):
    monkeypatch.delenv("DIPDEPLOY_DEBUG", raising=False)
    raising(ZeroDivisionError("division by zero"))
    if how == "--debug":
        res = runner.invoke(app, ["--debug", "models"])
    else:
        res = runner.invoke(app, ["models"], env={"DIPDEPLOY_DEBUG": "1"})
    assert res.exit_code == 1
    assert "Traceback (most recent call last)" in res.output and "ZeroDivisionError" in res.output
    assert res.output.strip().splitlines()[-1].startswith("error: internal error (ZeroDivisionError")


def test_debug_is_off_again_for_the_next_invocation(raising, monkeypatch):
    monkeypatch.delenv("DIPDEPLOY_DEBUG", raising=False)
    raising(ZeroDivisionError("division by zero"))
    assert "Traceback" in runner.invoke(app, ["--debug", "models"]).output
    assert "Traceback" not in runner.invoke(app, ["models"]).output
    assert "Traceback" not in runner.invoke(app, ["models"], env={"DIPDEPLOY_DEBUG": "0"}).output


def test_interrupt_is_one_line_exit_130(raising, monkeypatch):
    monkeypatch.delenv("DIPDEPLOY_DEBUG", raising=False)
    raising(KeyboardInterrupt())
    res = runner.invoke(app, ["models"])
    assert res.exit_code == 130 and res.output.strip() == "interrupted", res.output


def test_refusals_of_bad_input_keep_their_exit_2(monkeypatch):
    """A command's own refusal (core.fail) is untouched by the handler: same line, exit 2."""
    res = runner.invoke(app, ["inspect", "/nonexistent/bundle"])
    out = res.output.strip()
    assert res.exit_code == 2 and len(out.splitlines()) == 1 and "dipdeploy export" in out, out


def test_a_usage_error_and_the_version_are_unchanged():
    res = runner.invoke(app, ["models", "--debug"])  # a global option, given after the command
    assert res.exit_code == 2 and "No such option: --debug" in res.output
    assert runner.invoke(app, ["--version"]).exit_code == 0


def test_a_closed_pipe_stays_a_quiet_exit_1(raising, monkeypatch):
    """`dipdeploy models | head -1`: the reader went away; nothing to tell it (typer's own handling)."""
    monkeypatch.delenv("DIPDEPLOY_DEBUG", raising=False)
    raising(BrokenPipeError(errno.EPIPE, "Broken pipe"))
    res = runner.invoke(app, ["models"])
    assert res.exit_code == 1 and "error" not in res.output, res.output
