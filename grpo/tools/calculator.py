"""The calculator tool: `<calc>12*7</calc>` gives `<result>84</result>`.

The expression is parsed with Python's `ast` and evaluated by walking the tree here, never by
`eval`: only numbers, + - * / // % **, unary minus and plus, and parentheses are accepted. The
length, the exponents and every intermediate magnitude are bounded, so no input can take long or
allocate much. Anything else is a ToolError, which the model reads as its result.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable

from grpo.tools.base import Tool, ToolError, register_tool

MAX_CHARS = 200
MAX_EXPONENT = 100  # |b| in a ** b: with bounded a, a ** b stays cheap to compute before checking
# Beyond any GSM8K quantity, and below 2**53 so that a float result is still an exact integer.
MAX_ABS = 10**15

Number = int | float

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
# How the operators refused are named in the error the model reads.
_SYMBOLS = {
    ast.BitXor: "^ (powers are **)", ast.BitAnd: "&", ast.BitOr: "|", ast.LShift: "<<",
    ast.RShift: ">>", ast.MatMult: "@", ast.Invert: "~", ast.Not: "not",
}  # fmt: skip
# What a model writes for arithmetic that Python spells otherwise: 1,234 and the signs x, /, -.
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_SIGNS = str.maketrans({"×": "*", "÷": "/", "−": "-"})


def calculate(expression: str) -> str:
    """The value of an arithmetic expression, as text: integers without a point, other numbers
    to 12 significant digits. ToolError for anything else."""
    text = _THOUSANDS.sub("", expression.strip().translate(_SIGNS))
    if not text:
        raise ToolError("empty expression")
    if len(text) > MAX_CHARS:
        raise ToolError(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError):
        raise ToolError(f"not an arithmetic expression: {text}") from None
    try:
        return _format(_value(tree.body))
    except RecursionError:
        raise ToolError("expression nested too deeply") from None


def _value(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        # bool is an int subclass and complex a number: neither is arithmetic on quantities
        if type(node.value) not in (int, float):
            raise ToolError(f"not a number: {node.value!r}")
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and (type(node.op) in _BINARY or isinstance(node.op, ast.Pow)):
        left, right = _value(node.left), _value(node.right)
        try:
            if isinstance(node.op, ast.Pow):
                return _bounded(_power(left, right))
            return _bounded(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("result too large") from None
    op = getattr(node, "op", None)
    if op is not None:
        raise ToolError(f"unsupported operator {_SYMBOLS.get(type(op), type(op).__name__)}")
    raise ToolError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise ToolError(f"exponent larger than {MAX_EXPONENT}")
    result = base**exponent
    if isinstance(result, complex):  # (-8) ** 0.5
        raise ToolError("not a real number")
    return result


def _bounded(x: Number) -> Number:
    if isinstance(x, float) and not math.isfinite(x):
        raise ToolError("result too large")
    if abs(x) > MAX_ABS:
        raise ToolError(f"result larger than {MAX_ABS:.0e}")
    return x


def _format(x: Number) -> str:
    if isinstance(x, int):
        return str(x)
    if x.is_integer():  # 84 / 2 is 42, not 42.0 (and -0.0 is 0)
        return str(int(x))
    return format(x, ".12g")  # 0.1 + 0.2 is 0.3


TOOL = register_tool(Tool(name="calculator", tag="calc", run=calculate))
