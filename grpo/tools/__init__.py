"""Tools for multi-turn answers, looked up by name (``get_tool("calculator")``) or given as
``package.module:name`` (rollout.tools); the syntax and the masks: docs/tools.md."""

# Importing a tool module registers it with the registry in .base.
from . import calculator
from .base import (
    RESULT_CLOSE,
    RESULT_OPEN,
    Tool,
    Toolbox,
    ToolCall,
    ToolError,
    ToolResult,
    get_tool,
    register_tool,
    tool_names,
)

__all__ = [
    "RESULT_CLOSE",
    "RESULT_OPEN",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "Toolbox",
    "calculator",
    "get_tool",
    "register_tool",
    "tool_names",
]
