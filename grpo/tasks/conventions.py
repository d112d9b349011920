"""Reward functions as users bring them from other frameworks, called as grpo calls its own:
``fn(completion, row) -> float | (float, dict)``, one answer at a time, in the reward workers
(grpo.tasks.runner), so each call has the same time limit and the same error handling.

- ``row``: grpo's own (the README's reward contract).
- ``verl``: ``compute_score(data_source, solution_str, ground_truth, extra_info)`` as verl's
  reward managers call it, the arguments from the row's ``data_source``,
  ``reward_model.ground_truth`` and ``extra_info`` columns (verl's parquet schema); it returns
  a number, or a dict whose ``score`` is the reward (its other scalars go into the info).
- ``trl``: a TRL reward function ``fn(prompts, completions, **columns) -> list[float]``, called
  on a batch of one: ``prompts`` from the row's ``prompt`` column, ``completions`` the answer
  (as ``[{"role": "assistant", "content": ...}]`` when the prompt is a chat, as TRL does), and
  every other column of the row as a keyword (only those it names, if it takes no
  ``**kwargs``).

The convention is read from the signature (`style_of`), or declared before the spec:
``verl:package.module:function``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

Row = dict[str, Any]
STYLES = ("row", "verl", "trl")


def style_of(fn: Callable[..., Any]) -> str:
    """``verl`` for a function that takes ``solution_str`` and ``ground_truth``, ``trl`` for one
    that takes ``completions``, ``row`` otherwise (and when the signature cannot be read)."""
    try:
        names = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return "row"
    if {"solution_str", "ground_truth"} <= names:
        return "verl"
    if "completions" in names:
        return "trl"
    return "row"


def split_style(spec: str) -> tuple[str, str]:
    """``("verl", "pkg.mod:fn")`` from ``"verl:pkg.mod:fn"``; ``("", spec)`` with no style."""
    style, sep, rest = spec.partition(":")
    if sep and rest.count(":") == 1 and style in STYLES:
        return style, rest
    return "", spec


class _Adapter:
    """A user's function behind grpo's calling convention. Picklable when the function is (it
    travels to the workers by reference), and named after it in logs and errors."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.__module__ = getattr(fn, "__module__", None) or type(self).__module__
        self.__qualname__ = getattr(fn, "__qualname__", None) or repr(fn)
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            params = []  # type: ignore[assignment]
        self.takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
        self.names = {p.name for p in params}

    def keywords(self, candidates: dict[str, Any]) -> dict[str, Any]:
        """The `candidates` the function accepts."""
        if self.takes_any:
            return candidates
        return {k: v for k, v in candidates.items() if k in self.names}


class VerlReward(_Adapter):
    """A verl ``compute_score`` as a grpo reward (see the module docstring)."""

    def __call__(self, completion: str, row: Row) -> tuple[float, dict]:
        reward_model = row.get("reward_model")
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise KeyError("the row has no reward_model.ground_truth (verl's schema)")
        args = {
            "data_source": row.get("data_source"),
            "solution_str": completion,
            "ground_truth": reward_model["ground_truth"],
            "extra_info": row.get("extra_info"),
        }
        out = self.fn(**self.keywords(args))
        if isinstance(out, dict):
            if "score" not in out:
                raise TypeError(f"returned a dict without 'score' (keys: {sorted(out)})")
            info = {k: v for k, v in out.items() if k != "score"}
            return out["score"], {k: v for k, v in info.items() if _scalar(v)}
        return out, {}


class TrlReward(_Adapter):
    """A TRL reward function as a grpo reward, on a batch of one (see the module docstring)."""

    def __call__(self, completion: str, row: Row) -> float:
        prompt = row.get("prompt")
        answer: Any = completion
        if isinstance(prompt, list):  # conversational: TRL passes the answer as a message
            answer = [{"role": "assistant", "content": completion}]
        columns = {k: [v] for k, v in row.items() if k not in ("prompt", "completions")}
        out = self.fn(prompts=[prompt], completions=[answer], **self.keywords(columns))
        if not isinstance(out, list | tuple) or len(out) != 1:
            raise TypeError(f"returned {out!r:.80}; expected a list of one reward per answer")
        if out[0] is None:
            raise ValueError("returned None for the answer (TRL's 'not applicable')")
        return out[0]


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool) or hasattr(value, "item")


# How each convention calls a reward, as shown in errors, and with which arguments (of verl's,
# only those the function names are passed, so each of its parameters must be one of them or
# have a default).
_CALLS: dict[str, tuple[str, tuple[Any, ...], dict[str, Any]]] = {
    "row": ("fn(completion, row)", ("completion", {}), {}),
    "verl": (
        "compute_score(data_source, solution_str, ground_truth, extra_info)",
        (),
        dict.fromkeys(("data_source", "solution_str", "ground_truth", "extra_info")),
    ),
    "trl": ("fn(prompts, completions, **columns)", (), {"prompts": [None], "completions": [""]}),
}


def require_callable_as(fn: Callable[..., Any], style: str, name: str) -> None:
    """A reward whose signature cannot take the calls of its convention fails on every answer:
    refused when it is loaded, in one line, rather than scoring 0.0 for the whole run. (A
    signature that cannot be read is let through.)"""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    expected, args, keywords = _CALLS[style]
    names = set(signature.parameters)
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    if style == "verl" and not takes_any:  # VerlReward passes only what the function names
        keywords = {k: v for k, v in keywords.items() if k in names}
    # A TRL function's other parameters are the row's columns, which only a call shows.
    bind = signature.bind_partial if style == "trl" else signature.bind
    try:
        bind(*args, **keywords)
    except TypeError as exc:
        takes = ", ".join(str(p.replace(annotation=p.empty)) for p in signature.parameters.values())
        raise ValueError(
            f"reward {name} takes ({takes}), which cannot be called as {expected} ({exc})"
        ) from None


def adapt(fn: Callable[..., Any], style: str = "", name: str = "") -> Callable[..., Any]:
    """`fn` called as grpo calls a reward: as it is for ``row``, wrapped for ``verl`` and
    ``trl``; `style` '' reads the convention from the signature. `name`: the reward's in
    errors."""
    style = style or style_of(fn)
    require_callable_as(fn, style, name or getattr(fn, "__qualname__", repr(fn)))
    if style == "verl":
        return VerlReward(fn)
    if style == "trl":
        return TrlReward(fn)
    return fn
