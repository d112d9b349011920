"""Tools a model may call in a multi-turn answer, the registry that names them, and the call
syntax.

The syntax is one tag per tool: the model writes `<TAG>input</TAG>` (the calculator's tag is
`calc`: `<calc>12*7</calc>`); generation pauses at the closing tag, a stop string, and the
tool's output comes back as `<result>output</result>` (grpo.rollout.multi_turn appends it to the
answer's tokens, masked out of the loss). A tool is a name, a tag and a function from the input
text to the output text. An input the tool refuses is a ToolError, whose message the model reads
as `<result>error: ...</result>`; the run goes on whatever a tool raises.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from grpo.core.registry import Registry

log = logging.getLogger("grpo.tools")

RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
_TAG = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # no '<', '>' or space: the tags stay unambiguous


class ToolError(Exception):
    """An input the tool refuses; its message is the result the model reads ('error: ...')."""


@dataclass(frozen=True)
class Tool:
    name: str  # what rollout.tools lists
    tag: str  # the call is <tag>input</tag>
    run: Callable[[str], str]  # input text -> output text; ToolError for a refusal

    @property
    def open_tag(self) -> str:
        return f"<{self.tag}>"

    @property
    def close_tag(self) -> str:
        return f"</{self.tag}>"


@dataclass(frozen=True)
class ToolCall:
    tool: Tool
    argument: str | None  # the text between the tags; None: a closing tag without its opening


@dataclass(frozen=True)
class ToolResult:
    text: str  # what is appended to the answer: <result>...</result>
    error: bool


# --------------------------------------------------------------------------- registry

TOOLS: Registry[Tool] = Registry("tool", lambda t: isinstance(t, Tool), "a grpo.tools.Tool")


def register_tool(tool: Tool) -> Tool:
    """Add a tool to the registry; a name clash is an error, never an overwrite."""
    TOOLS.add(tool.name, tool)
    return tool


tool_names = TOOLS.names
get_tool = TOOLS.get


# --------------------------------------------------------------------------- calls


class Toolbox:
    """The tools of a run: the stop strings that pause generation at a call, finding the call
    a turn ends with, and running it."""

    def __init__(self, tools: Sequence[Tool]):
        if not tools:
            raise ValueError("a toolbox needs at least one tool")
        for tool in tools:
            if not _TAG.fullmatch(tool.tag):
                raise ValueError(
                    f"tool {tool.name!r} has tag {tool.tag!r}: use letters, digits, _ and -"
                )
        for what, keys in (("name", [t.name for t in tools]), ("tag", [t.tag for t in tools])):
            if len(set(keys)) < len(keys):
                raise ValueError(f"two tools share a {what}: {keys}")
        self.tools = tuple(tools)
        self._by_close = {t.close_tag: t for t in tools}

    @classmethod
    def named(cls, names: Sequence[str]) -> Toolbox:
        """The toolbox of these registered names or `package.module:NAME` specs (rollout.tools)."""
        return cls([get_tool(name) for name in names])

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return tuple(self._by_close)

    def find_call(self, text: str, other_stops: Sequence[str] = ()) -> ToolCall | None:
        """The call a turn's `text` ends with, or None. An engine stops a turn where its text
        first contains a stop string, so the stop string that ends first is the one that
        stopped it: a tool's closing tag is a call, one of `other_stops` (rollout.stop) ends the
        answer."""
        ends = [(text.find(s) + len(s), s) for s in (*other_stops, *self._by_close) if s in text]
        if not ends:
            return None
        end, stop = min(ends)
        tool = self._by_close.get(stop)
        if tool is None:
            return None
        body_end = end - len(stop)
        start = text.rfind(tool.open_tag, 0, body_end)
        argument = None if start < 0 else text[start + len(tool.open_tag) : body_end]
        return ToolCall(tool, argument)

    def run(self, call: ToolCall) -> ToolResult:
        """The result text of `call`; a refusal or a failure is an error result, never an
        exception (a user tool that raises something else is also logged: it is a bug)."""
        tool = call.tool
        if call.argument is None:
            return _result(f"error: {tool.close_tag} without {tool.open_tag}", True)
        try:
            return _result(str(tool.run(call.argument)), False)
        except ToolError as e:
            return _result(f"error: {e}", True)
        except Exception as e:  # noqa: BLE001 - one bad call must not end the run
            log.warning(
                "tool %s failed on %r: %s: %s", tool.name, call.argument, type(e).__name__, e
            )
            return _result(f"error: {type(e).__name__}: {e}", True)


def _result(output: str, error: bool) -> ToolResult:
    return ToolResult(f"{RESULT_OPEN}{output}{RESULT_CLOSE}", error)
