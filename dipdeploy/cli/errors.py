"""What the CLI says about an exception no command caught: one line with the cause and the fix.

Why: a traceback tells a user of the command line neither what went wrong in their terms nor what to do,
and a hostile or damaged file must not be able to make the tool look broken. Each command refuses the
bad input it foresees itself (``core.fail``, exit 2); whatever still escapes reaches :func:`describe`
through ``_Group`` (``_app.py``). The classes that come from damaged or foreign input (text that is not
UTF-8, a truncated file or archive, a graph or a weight file onnxruntime or safetensors refuses, a
tokenizer.json that tokenizers cannot parse) are named with their fix and exit 2 like any bad input;
running out of memory, a failed write, a missing optional part of the install (``dipdeploy.extras``) and
anything unforeseen exit 1.
``--debug`` or ``DIPDEPLOY_DEBUG=1`` adds the traceback.
"""

from __future__ import annotations

import errno
import re
import struct
import zipfile

from dipdeploy.extras import MissingExtra, extra_of
from dipdeploy.extras import message as extra_message
from dipdeploy.terminal import shown

#: exit codes: the user's input (as ``core.fail``), anything else, an interrupt (128 + SIGINT, as shells do)
BAD_INPUT, FAILED, INTERRUPTED = 2, 1, 130
DEBUG = "rerun with --debug for the traceback"
_LONGEST = 300  # characters of a library's message kept in the line: its first sentence, not a dump

_ORT_MODULE = "onnxruntime.capi.onnxruntime_pybind11_state"
#: tokenizers raises a bare Exception carrying its JSON parser's (serde's) position
_SERDE = re.compile(r"at line \d+ column \d+$")
_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\]\s*:\s*\d+\s*:\s*\w+\s*:\s*")
#: fixes for an OSError by its errno; any other names the file and asks for --debug
_OS_FIXES = {
    errno.ENOSPC: "free space on that filesystem or choose another path",
    errno.EDQUOT: "free space within your quota or choose another path",
    errno.EACCES: "check its permissions or choose another path",
    errno.EPERM: "check its permissions or choose another path",
    errno.EROFS: "the filesystem is read-only: choose another path",
    errno.ENOENT: "check the path",
    errno.EMFILE: "raise the limit of open files (ulimit -n)",
    errno.ENFILE: "close other programs' files or raise the system's limit (fs.file-max)",
    errno.EIO: "the device reported a read or write error: check the disk",
}


def _detail(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= _LONGEST else text[:_LONGEST] + "…"


def _os_error(err: OSError) -> tuple[str, int]:
    what = err.strerror or _detail(err) or type(err).__name__
    where = "".join(f"{' → ' if i else ': '}{name}" for i, name in enumerate(
        n for n in (err.filename, err.filename2) if n is not None))
    return f"{what}{where}; {_OS_FIXES.get(err.errno, DEBUG)}", FAILED


def _unicode(err: UnicodeError) -> tuple[str, int]:
    if isinstance(err, UnicodeDecodeError):
        bad = bytes(err.object[err.start:err.end])
        return (f"text is not valid UTF-8 ({err.reason}: byte {bad!r} at offset {err.start}); give UTF-8 text "
                f"(a prompt, a text file, a tokenizer or a template), or convert it (iconv -t UTF-8)"), BAD_INPUT
    if isinstance(err, UnicodeEncodeError) and any(0xDC80 <= ord(c) <= 0xDCFF for c in err.object):
        return ("text holds bytes that are not valid UTF-8 (an argument, a prompt or a file name, at character "
                f"{err.start}); give UTF-8 text (a UTF-8 locale: LANG=C.UTF-8)"), BAD_INPUT
    return f"text could not be converted ({type(err).__name__}: {_detail(err)}); give UTF-8 text", BAD_INPUT


def describe(err: BaseException) -> tuple[str, int]:
    """(the line after ``error: ``, unescaped; the exit code) for an exception a command did not catch."""
    kind, module = type(err).__name__, type(err).__module__
    if isinstance(err, KeyboardInterrupt):
        return "interrupted", INTERRUPTED
    if isinstance(err, MemoryError):
        return ("memory ran out (MemoryError); raise the limit the run is under (ulimit -v, the container's or "
                "the cgroup's memory.max) or ask for less (smaller sizes in the options: --dram-budget, --context, "
                "--batch-size, --io-gap…; or a smaller model)"), FAILED
    if module == _ORT_MODULE:
        message = _ORT_PREFIX.sub("", _detail(err))
        if kind == "RuntimeException":
            return (f"onnxruntime failed while running a graph ({kind}: {message}); check the bundle with "
                    f"`dipdeploy inspect BUNDLE --verify`, or {DEBUG}"), FAILED
        return (f"onnxruntime refused a graph or its inputs ({kind}: {message}); the bundle is damaged or needs "
                f"another onnxruntime: check it with `dipdeploy inspect BUNDLE --verify` or export it again with "
                f"`dipdeploy export`"), BAD_INPUT
    if kind == "SafetensorError":
        return (f"a .safetensors file is damaged ({_detail(err)}); download or save the model again"), BAD_INPUT
    if kind == "PanicException":  # pyo3's (tokenizers, safetensors): a Rust library gave up on its input
        return (f"a native library gave up on its input (PanicException: {_detail(err)}); the tokenizer or weight "
                f"files may be damaged: download or export them again, or {DEBUG}"), FAILED
    if type(err) is Exception and _SERDE.search(_detail(err)):
        return (f"a tokenizer file could not be read ({_detail(err)}); the bundle's or the model's tokenizer.json "
                f"is damaged or of a newer format: export or download it again"), BAD_INPUT
    if isinstance(err, UnicodeError):
        return _unicode(err)
    if isinstance(err, zipfile.BadZipFile):  # a .npz (trace, packed weights) is a zip archive
        return (f"a .npz or zip file is damaged or truncated ({_detail(err)}); create it again (`dipdeploy "
                f"trace`, `run --trace`, `quantize`) or download it again"), BAD_INPUT
    if isinstance(err, struct.error):
        return (f"a file ended early or has a damaged header (struct.error: {_detail(err)}); it is truncated or "
                f"not of the format expected: download or create it again"), BAD_INPUT
    if isinstance(err, OSError):
        return _os_error(err)
    if isinstance(err, ModuleNotFoundError) and extra_of(err.name) is not None:
        return (str(err) if isinstance(err, MissingExtra) else extra_message(extra_of(err.name), err.name)), FAILED
    return f"internal error ({kind}: {_detail(err)}); {DEBUG}", FAILED


def line(err: BaseException) -> tuple[str, int]:
    """(the whole line as printed, safe for a terminal; the exit code)."""
    text, code = describe(err)
    return (text if code == INTERRUPTED else "error: " + shown(text, markup=False)), code
