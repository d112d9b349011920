"""grpo.tools: the calculator, the call syntax (finding a call, running it) and the registry."""

from __future__ import annotations

import builtins

import pytest

from grpo.tools import RESULT_CLOSE, RESULT_OPEN, Tool, Toolbox, ToolError, get_tool, tool_names
from grpo.tools.base import register_tool
from grpo.tools.calculator import MAX_ABS, MAX_CHARS, calculate

# --------------------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12*7", "84"),
        (" 48 / 2 ", "24"),  # an integral quotient has no point
        ("10/4", "2.5"),
        ("10/3", "3.33333333333"),  # 12 significant digits
        ("0.1 + 0.2", "0.3"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),  # Python's floor division
        ("17 % 5", "2"),
        ("2 ** 10", "1024"),
        ("2 ** -1", "0.5"),
        ("-(3 + 4) * 2", "-14"),
        ("+5 - -3", "8"),
        ("((1 + 2) * (3 + 4))", "21"),
        ("1,234 + 1", "1235"),  # thousands separators, as GSM8K writes them
        ("3 × 4 ÷ 2 − 1", "5"),
        ("1.5e3", "1500"),
        ("-0.0", "0"),
        (f"{MAX_ABS} - 1", str(MAX_ABS - 1)),
    ],
)
def test_calculator_values(expression, value):
    assert calculate(expression) == value


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("1 / 0", "division by zero"),
        ("5 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("__import__('os').system('true')", "not Call"),  # names and calls
        ("open('/etc/passwd')", "not Call"),
        ("x + 1", "not Name"),
        ("(1).__class__", "not Attribute"),  # attributes
        ("[1] * 3", "not List"),
        ("'a' * 3", "not a number"),
        ("True + 1", "not a number"),  # bool is an int, but not a quantity
        ("1j * 2", "not a number"),
        ("lambda: 1", "not Lambda"),
        ("1 if 2 else 3", "not IfExp"),
        ("2 ^ 3", r"\^ \(powers are"),
        ("1 << 40", "<<"),
        ("1 < 2", "not Compare"),
        ("9 ** 9 ** 9", "exponent larger than"),  # the tower is refused before it is computed
        ("2 ** 101", "exponent larger than"),
        ("10 ** 16", "result larger than"),
        (f"{MAX_ABS} + 1", "result larger than"),
        ("99999999999999999999", "result larger than"),  # a literal is bounded too
        ("1e400", "too large"),
        ("1e15 * 1e15", "result larger than"),
        ("(-8) ** 0.5", "not a real number"),
        ("", "empty"),
        ("12 * 7 =", "not an arithmetic expression"),
        ("1" * (MAX_CHARS + 1), f"longer than {MAX_CHARS}"),
        ("-" * (MAX_CHARS - 1) + "1", None),  # long but within bounds: a value, not an error
    ],
)
def test_calculator_refuses(expression, error):
    if error is None:
        assert calculate(expression) in ("1", "-1")
        return
    with pytest.raises(ToolError, match=error):
        calculate(expression)


def test_calculator_never_evals(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("eval/exec called")

    monkeypatch.setattr(builtins, "eval", forbidden)
    monkeypatch.setattr(builtins, "exec", forbidden)
    assert calculate("(2 + 3) * 4 ** 2 / 8") == "10"


# --------------------------------------------------------------------------- calls


CALC = get_tool("calculator")


def echo(text: str) -> str:
    return text.upper()


def broken(text: str) -> str:
    raise KeyError(text)


def test_the_call_a_turn_ends_with():
    box = Toolbox([CALC, Tool("echo", "say", echo)])
    assert box.stop_strings == ("</calc>", "</say>")
    call = box.find_call("Let me compute: <calc>12*7</calc>")
    assert call.tool is CALC and call.argument == "12*7"
    # the last opening tag before the closing one; text after it (a token's overhang) is fine
    call = box.find_call("<calc>1</calc> no: <calc> 2+2 </calc>.")
    assert call.argument == "1"  # the first closing tag is where the engine stopped
    call = box.find_call("<say>hi <calc>1+1</calc>")
    assert call.tool is CALC and call.argument == "1+1"
    assert box.find_call("#### 84") is None
    # a rollout.stop string that ends first ends the answer; one that ends later does not
    assert box.find_call("#### 84\n<calc>1</calc>", ["#### 84"]) is None
    assert box.find_call("<calc>1</calc> #### 84", ["#### 84"]).argument == "1"
    assert box.find_call("12*7</calc>").argument is None  # no opening tag


def test_running_a_call_gives_a_result_text_never_an_exception(caplog):
    box = Toolbox([CALC, Tool("echo", "say", echo), Tool("broken", "bad", broken)])

    def run(text: str):
        return box.run(box.find_call(text))

    ok = run("<calc>12*7</calc>")
    assert ok.text == f"{RESULT_OPEN}84{RESULT_CLOSE}" and not ok.error
    assert run("<say>hi</say>").text == "<result>HI</result>"
    refused = run("<calc>1/0</calc>")
    assert refused.text == "<result>error: division by zero</result>" and refused.error
    missing = run("12*7</calc>")
    assert missing.text == "<result>error: </calc> without <calc></result>" and missing.error
    with caplog.at_level("WARNING", logger="grpo.tools"):
        crashed = run("<bad>x</bad>")
    assert crashed.error and crashed.text == "<result>error: KeyError: 'x'</result>"
    assert "tool broken failed" in caplog.text  # a tool that raises anything else is a bug


# --------------------------------------------------------------------------- registry


MY_TOOL = Tool("shout", "shout", echo)


def test_tools_by_name_or_by_spec():
    assert "calculator" in tool_names() and get_tool("calculator") is CALC
    assert get_tool("tests.test_tools:MY_TOOL") is MY_TOOL
    with pytest.raises(ValueError, match="unknown tool 'calculater'.*did you mean 'calculator'"):
        get_tool("calculater")
    with pytest.raises(ValueError, match="not a grpo.tools.Tool"):
        get_tool("tests.test_tools:echo")
    with pytest.raises(ValueError, match="already registered"):
        register_tool(Tool("calculator", "calc2", echo))


def test_a_toolbox_refuses_clashes_and_bad_tags():
    with pytest.raises(ValueError, match="share a tag"):
        Toolbox([CALC, Tool("other", "calc", echo)])
    with pytest.raises(ValueError, match="share a name"):
        Toolbox([CALC, CALC])
    with pytest.raises(ValueError, match="tag 'a b'"):
        Toolbox([Tool("spaced", "a b", echo)])
    with pytest.raises(ValueError, match="at least one"):
        Toolbox([])
