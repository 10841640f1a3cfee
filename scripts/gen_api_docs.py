"""Fill the API pages (docs/api/*.md) from the code's signatures and docstrings, so they read as plain Markdown
(on GitHub, in an editor) and in the built site alike, and cannot drift from the code.

A page marks each generated part with ``<!-- api: roll.module[.Name] [members=A,B] -->`` ... ``<!-- /api -->``;
everything between the markers is rewritten, everything else is the page's own text.

    python scripts/gen_api_docs.py            # rewrite docs/api/*.md
    python scripts/gen_api_docs.py --check    # exit 1 if a page differs from the generated text
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PAGES = REPO / "docs" / "api"
MARKED = re.compile(
    r"(<!-- api: (?P<target>[\w.]+)(?: members=(?P<members>[\w,]+))? -->\n)(?P<body>.*?)"
    r"(<!-- /api -->)",
    re.S,
)
SECTIONS = ("Args", "Arguments", "Attributes", "Returns", "Raises", "Yields")


def resolve(target: str) -> Any:
    """The module, or the attribute of the longest importable module prefix, named by ``target``."""
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(target)


def _annotation(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return ""
    text = value if isinstance(value, str) else inspect.formatannotation(value)
    return text.replace("typing.", "")


def _default(value: Any) -> str:
    text = repr(value)
    return "..." if " at 0x" in text or len(text) > 60 else text


def signature(obj: Any, name: str) -> str | None:
    """``name(a: int, b: str = 'x') -> bool`` (``self`` dropped), or None when Python cannot tell."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = []
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if _annotation(p.annotation):
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            text += f" = {_default(p.default)}"
        params.append(text)
    if any(p.kind == p.KEYWORD_ONLY for p in sig.parameters.values()) and not any(
        p.kind == p.VAR_POSITIONAL for p in sig.parameters.values()
    ):
        first = next(
            i
            for i, p in enumerate(q for q in sig.parameters.values() if q.name not in ("self", "cls"))
            if p.kind == p.KEYWORD_ONLY
        )
        params.insert(first, "*")
    returns = _annotation(sig.return_annotation)
    text = f"{name}({', '.join(params)})" + (f" -> {returns}" if returns and not inspect.isclass(obj) else "")
    if len(text) > 100:
        text = (
            f"{name}(\n"
            + "".join(f"    {p},\n" for p in params)
            + ")"
            + (f" -> {returns}" if returns and not inspect.isclass(obj) else "")
        )
    return text


def docstring(obj: Any) -> str:
    """The docstring as Markdown: a Google-style section (``Args:`` ...) becomes a bold heading and a bullet list,
    any other heading line (``Action space:``) a bold heading over its dedented text."""
    doc = inspect.getdoc(obj) or ""
    out: list[str] = []
    section: str | None = None  # "list" inside Args/Returns/..., "text" inside another heading's block
    for line in doc.splitlines():
        heading = not line.startswith(" ") and line.endswith(":") and 0 < len(line) < 40
        if heading:
            out += ["", f"**{line[:-1]}:**", ""]
            section = "list" if line[:-1] in SECTIONS else "text"
        elif section == "list" and line.startswith("    ") and not line.startswith("        "):
            name, sep, rest = line.strip().partition(": ")
            out.append(f"- `{name}`: {rest}" if sep and " " not in name.strip("*") else f"- {line.strip()}")
        elif section == "list" and line.startswith("        "):
            out[-1] += " " + line.strip()
        elif section == "text" and line.startswith("    "):
            out.append(line[4:])
        else:
            section = None if not line.startswith(" ") else section
            out.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


def _own_members(cls: type) -> list[tuple[str, Any]]:
    """Public methods and properties the class defines itself, in source order (dataclass fields excluded)."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    found = []
    for name, value in vars(cls).items():
        if name.startswith("_") or name in fields:
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            found.append((name, value))
    return found


def render(obj: Any, qualname: str, level: int = 2) -> list[str]:
    """One object's section: an anchor (the site's ``#module.Name`` links), a heading, the signature, the docs."""
    name = qualname.rsplit(".", 1)[-1]
    lines = [f'<a id="{qualname}"></a>', "", f"{'#' * level} `{name}`", ""]
    if inspect.isclass(obj) or callable(obj) or isinstance(obj, property):
        target = obj.fget if isinstance(obj, property) else obj
        sig = (
            None if isinstance(obj, property) else signature(target, ("class " if inspect.isclass(obj) else "") + name)
        )
        if inspect.isclass(obj):
            bases = [b.__name__ for b in obj.__bases__ if b is not object]
            if sig is None or not inspect.signature(obj).parameters or obj.__init__ is object.__init__:
                sig = f"class {name}" + (f"({', '.join(bases)})" if bases else "")
        if sig:
            lines += ["```python", sig, "```", ""]
        text = docstring(target)
    else:
        lines += ["```python", f"{name}: {type(obj).__name__}", "```", ""]
        text = ""
    if text:
        lines += [f"`{qualname}`", "", text, ""]
    else:
        lines += [f"`{qualname}`", ""]
    if inspect.isclass(obj):
        for member, value in _own_members(obj):
            lines += render(value, f"{qualname}.{member}", level + 1)
    return lines


def generate(target: str, members: list[str] | None) -> str:
    """The Markdown between one pair of markers."""
    obj = resolve(target)
    lines: list[str] = [""]
    if inspect.ismodule(obj):
        for name in members or getattr(obj, "__all__", []):
            lines += render(getattr(obj, name), f"{target}.{name}")
    else:
        lines += render(obj, target)
    return "\n".join(lines).rstrip() + "\n\n"


def fill(text: str) -> str:
    """``text`` with every marked part regenerated."""

    def replace(match: re.Match) -> str:
        members = match["members"].split(",") if match["members"] else None
        return match.group(1) + generate(match["target"], members) + match.group(5)

    return MARKED.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is not up to date")
    args = parser.parse_args(argv)
    stale = []
    for page in sorted(PAGES.glob("*.md")):
        text = page.read_text()
        new = fill(text)
        if new != text:
            stale.append(page)
            if not args.check:
                page.write_text(new)
                print(f"wrote {page.relative_to(REPO)}")
    if args.check and stale:
        print(f"stale: {[str(p.relative_to(REPO)) for p in stale]}; run python scripts/gen_api_docs.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
