"""Parser of the NKI API listing (``nki_0_6.api``): text in, the JSON document the package reads out.

The listing format is described at the top of ``nki_0_6.api``. :func:`parse_listing` returns a plain
dict (``version``, ``entries``, ``modules``, ``members``, ``removed``) that ``tools/gen_nki_api.py``
writes to ``nki_0_6.json``; ``tests/test_nki_api_listing.py`` checks the two agree. A malformed line
raises :class:`ListingError` naming its line number.
"""

from __future__ import annotations

import ast
import logging
from typing import Any

log = logging.getLogger(__name__)

KINDS = frozenset(("function", "method", "method_alias", "attribute", "property", "class", "enum", "enum_member",
                   "constant", "dtype", "memory_region", "operator_constant", "type_alias"))
_FLAGS = frozenset(("experimental",))
_KEYS = frozenset(("deprecated", "min_nc", "engine", "value", "alias_of", "bases", "returns", "legacy", "note"))
SCHEMA = 1


class ListingError(ValueError):
    """A line of the API listing does not follow its format."""


def _params(sig: str, lineno: int) -> list[list[Any]]:
    """``(a, b=1, *c, **d)`` -> ``[[name, kind, default-or-None], ...]`` (defaults as source text)."""
    try:
        fn = ast.parse(f"def _f{sig}: pass").body[0]
    except SyntaxError as exc:
        raise ListingError(f"line {lineno}: bad parameter list {sig!r}: {exc.msg}") from None
    assert isinstance(fn, ast.FunctionDef)
    a = fn.args
    out: list[list[Any]] = []
    positional = a.posonlyargs + a.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults, strict=True)):
        kind = "positional_only" if i < len(a.posonlyargs) else "positional_or_keyword"
        out.append([arg.arg, kind, None if default is None else ast.unparse(default)])
    if a.vararg is not None:
        out.append([a.vararg.arg, "var_positional", None])
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out.append([arg.arg, "keyword_only", None if default is None else ast.unparse(default)])
    if a.kwarg is not None:
        out.append([a.kwarg.arg, "var_keyword", None])
    return out


def _entry(module: str, line: str, lineno: int) -> dict[str, Any]:
    head, *attrs = [part.strip() for part in line.split(" | ")]
    kind, _, rest = head.partition(" ")
    if kind not in KINDS:
        raise ListingError(f"line {lineno}: unknown kind {kind!r} (one of {', '.join(sorted(KINDS))})")
    name, paren, sig = rest.partition("(")
    name = name.strip()
    if not name or not all(part.isidentifier() for part in name.split(".")):
        raise ListingError(f"line {lineno}: bad name {name!r}")
    entry: dict[str, Any] = {"module": module, "qualname": name, "kind": kind,
                             "params": _params(paren + sig, lineno) if paren else None,
                             "deprecated": None, "experimental": False, "min_nc": None, "engine": None,
                             "value": None, "alias_of": None, "bases": None, "returns": None, "legacy": None,
                             "note": None, "kwargs_notes": {}}
    for attr in attrs:
        key, eq, value = attr.partition("=")
        if not eq:
            if key not in _FLAGS:
                raise ListingError(f"line {lineno}: unknown flag {key!r} (flags: {', '.join(sorted(_FLAGS))})")
            entry[key] = True
        elif key.startswith("kwarg."):
            entry["kwargs_notes"][key.removeprefix("kwarg.")] = value
        elif key in _KEYS:
            entry[key] = int(value) if key == "min_nc" else value
        else:
            raise ListingError(f"line {lineno}: unknown attribute {key!r} (one of {', '.join(sorted(_KEYS))}, "
                               "kwarg.<param>)")
    return entry


def _removed(line: str, lineno: int) -> dict[str, str]:
    head, *attrs = [part.strip() for part in line.split(" | ")]
    item = {"name": head.removeprefix("removed ").strip(), "status": "", "use": ""}
    for attr in attrs:
        key, eq, value = attr.partition("=")
        if not eq or key not in ("status", "use"):
            raise ListingError(f"line {lineno}: a removed line takes status=... and use=..., got {attr!r}")
        item[key] = value
    if not item["status"] or not item["use"]:
        raise ListingError(f"line {lineno}: a removed line needs both status= and use=")
    return item


def parse_listing(text: str, version: str = "0.6.0") -> dict[str, Any]:
    """Parse the listing text into the JSON document of the package (deterministic, sorted)."""
    module = ""
    entries: list[dict[str, Any]] = []
    removed: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            module = line[1:-1]
            continue
        if not module:
            raise ListingError(f"line {lineno}: a name before the first [module] section")
        if module == "removed":
            if not line.startswith("removed "):
                raise ListingError(f"line {lineno}: the [removed] section holds 'removed NAME | ...' lines")
            removed.append(_removed(line, lineno))
            continue
        entry = _entry(module, line, lineno)
        key = (module, entry["qualname"])
        if key in seen:
            raise ListingError(f"line {lineno}: {module}.{entry['qualname']} is listed twice")
        seen.add(key)
        entries.append(entry)
    modules: dict[str, list[str]] = {}
    members: dict[str, list[str]] = {}
    for e in entries:
        owner, dot, member = e["qualname"].partition(".")
        if dot:
            members.setdefault(f"{e['module']}.{owner}", []).append(member)
        else:
            modules.setdefault(e["module"], []).append(owner)
    return {"schema": SCHEMA, "nki_version": version, "entries": entries,
            "modules": {k: sorted(v) for k, v in sorted(modules.items())},
            "members": {k: sorted(v) for k, v in sorted(members.items())}, "removed": removed}
