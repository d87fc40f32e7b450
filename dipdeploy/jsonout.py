"""The JSON documents the commands write (``--json``, and ``bench -o json``): each one an object whose first
keys name its schema (``dipdeploy.<command>``) and that schema's version, so a script that reads one can tell
what it holds and refuse what it does not understand, as the readers of the file interfaces do
(``docs/design.md``, "Files are the interfaces").

A version changes when a key is removed or renamed or its meaning changes; a key added leaves it as it is,
and a reader ignores keys it does not know. A document whose body is a list of rows holds them under
``rows``. Files written before the two keys existed (a bare list of rows, or an object without ``schema``)
read as version 0 of the schema their reader expects (:func:`read`). ``docs/json.md`` lists every
document's keys; ``tests/test_json_docs.py`` holds that page to what the commands write.

Floor 1: stdlib only.
"""

from __future__ import annotations

import json

PREFIX = "dipdeploy."
#: the document of each command (a subcommand after a dot) → its schema version: the one definition
VERSIONS: dict[str, int] = {
    "eval": 1, "eval.bundle": 1, "eval.humaneval": 1, "demo": 1, "simulate": 1, "devices": 1, "export": 1, "inspect": 1, "run": 1,
    "bench.decode": 1, "bench.memory": 1, "bench.reads": 1, "bench.kernels": 1, "bench.accuracy": 1,
    "bench.simulate": 1,
}
#: the keys every document starts with
HEAD = ("schema", "schema_version")


def schema(command: str) -> str:
    """The schema name of ``command``'s document (``dipdeploy.eval``)."""
    if command not in VERSIONS:
        raise KeyError(f"no JSON document is defined for {command!r}; add it to dipdeploy.jsonout.VERSIONS and "
                       f"docs/json.md")
    return PREFIX + command


def document(command: str, body: dict | list) -> dict:
    """``body`` under the schema keys of ``command``: a dict's keys follow them, a list goes under ``rows``."""
    head = {"schema": schema(command), "schema_version": VERSIONS[command]}
    if isinstance(body, list):
        return {**head, "rows": body}
    clash = [k for k in HEAD if k in body]
    if clash:
        raise ValueError(f"the {command} document's body has the key {clash[0]!r} that the schema keys own")
    return {**head, **body}


def dumps(command: str, body: dict | list, *, ensure_ascii: bool = True) -> str:
    """:func:`document` as the text every command writes (one-space indent)."""
    return json.dumps(document(command, body), indent=1, ensure_ascii=ensure_ascii)


def read(data: object, command: str, source: object) -> dict:
    """Parsed JSON ``data`` (from ``source``, named in the message) as a document of ``command``: one written
    before the schema keys existed is taken as version 0 (a bare list becomes ``{"rows": list}``); another
    schema, or a version newer than this dipdeploy writes, is refused naming the file and the fix."""
    typed = "eval --task humaneval" if command == "eval.humaneval" else command.replace(".", " ")
    writer = f"the JSON that `dipdeploy {typed}` writes"
    if isinstance(data, list):
        return {"schema": schema(command), "schema_version": 0, "rows": data}
    if not isinstance(data, dict):
        raise ValueError(f"{source} is not a dipdeploy JSON document (an object or a list of rows); give {writer}")
    if "schema" not in data:
        return {"schema": schema(command), "schema_version": 0, **data}
    if data["schema"] != schema(command):
        raise ValueError(f"{source} holds {data['schema']!r}, not {schema(command)!r}; give {writer}")
    version = data.get("schema_version")
    if type(version) is not int or not 0 <= version <= VERSIONS[command]:
        raise ValueError(f"{source} is {schema(command)} version {version!r}; this dipdeploy reads versions up to "
                         f"{VERSIONS[command]}: upgrade dipdeploy")
    return data
