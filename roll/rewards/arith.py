"""A safe parser for simple arithmetic answers, evaluated exactly as :class:`fractions.Fraction`.

Accepts numbers (``12``, ``-3.5``, ``1e3``), ``+ - * /``, powers with small integer exponents, parentheses and
the LaTeX forms ``\\frac{a}{b}`` (also ``\\dfrac``/``\\tfrac``), ``\\cdot``, ``\\times``, ``\\div``, ``^``, braces.
The text is parsed with :func:`ast.parse` and only number and arithmetic nodes are walked: nothing is ever
evaluated by Python, and sizes are bounded (input length, exponent, result bits) so no input can hang it.
"""

from __future__ import annotations

import ast
import re
from fractions import Fraction

MAX_CHARS = 200
MAX_EXPONENT = 64
MAX_BITS = 4096

_LATEX_OPS = (("\\cdot", "*"), ("\\times", "*"), ("\\div", "/"), ("×", "*"), ("÷", "/"), ("^", "**"))
_FRAC = re.compile(r"\\[dt]?frac\s*")


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """The ``{...}`` group starting at ``text[start]`` and the index after it, or None."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i], i + 1
    return None


def _expand_fracs(text: str) -> str | None:
    """Rewrite every ``\\frac{a}{b}`` as ``((a)/(b))``; None if a ``\\frac`` lacks its two groups."""
    while (match := _FRAC.search(text)) is not None:
        num = _braced(text, match.end())
        den = _braced(text, num[1]) if num else None
        if num is None or den is None:
            return None
        text = f"{text[: match.start()]}(({num[0]})/({den[0]})){text[den[1] :]}"
    return text


def _to_python_syntax(text: str) -> str | None:
    text = _expand_fracs(text)
    if text is None:
        return None
    for latex, op in _LATEX_OPS:
        text = text.replace(latex, op)
    return text.replace("{", "(").replace("}", ")")


def _bits(value: Fraction) -> int:
    return value.numerator.bit_length() + value.denominator.bit_length()


def _walk(node: ast.AST, source: str) -> Fraction:
    """Evaluate an arithmetic AST exactly; raise ValueError on anything else."""
    if isinstance(node, ast.Expression):
        return _walk(node.body, source)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(ast.get_source_segment(source, node) or repr(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _walk(node.operand, source)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _walk(node.left, source), _walk(node.right, source)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div):
            return left / right  # ZeroDivisionError is caught by the caller
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1 or abs(right) > MAX_EXPONENT or _bits(left) * abs(right) > MAX_BITS:
                raise ValueError("exponent too large or not an integer")
            return left ** int(right)
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


def parse_number(text: str) -> Fraction | None:
    """The exact value of a simple arithmetic expression, or None if it is not one.

    Examples: ``"1/2"`` -> 1/2, ``"\\frac{3}{4}"`` -> 3/4, ``"2+3*4"`` -> 14, ``"-0.25"`` -> -1/4,
    ``"2^{10}"`` -> 1024, ``"x+1"`` -> None, ``"10^{10^{10}}"`` -> None (too large).
    """
    if not text or len(text) > MAX_CHARS:
        return None
    source = _to_python_syntax(text.strip())
    if not source:
        return None
    try:
        value = _walk(ast.parse(source, mode="eval"), source)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return None
    return value if _bits(value) <= MAX_BITS else None
