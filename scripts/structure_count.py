"""Counts of how legible the package is (issue 60), read from the source with ast, so anyone
can rerun them on any commit:

    python -m scripts.structure_count [--repo DIR] [--json]

- `version_files_<mode>`: files a version crosses from the trainer's step to what the sampler
  samples with, in weights.mode files and stream: the files of the functions on a call path of
  each leg (`legs`: from a leg's first function to one of its last), of what the mode's two
  ends run to serve and to receive within grpo/weights/, and of the hops named
  (`HOPS`: the heartbeat that carries the announcement, across processes; the consumers a
  version goes into, called through a protocol), less the plumbing
  every path shares (core, config, runtime, observe, wire).
- `step_files`: files on the GRPO step: on a call path from the trainer loop's step to one of
  its stages (scoring, the experience, the advantages, the policy loss), less that plumbing
  and the maths (grpo/algos: pure tensor functions, checked against verl).
- `mode_files`: files outside grpo/weights/ whose code names a mode's own things (relays,
  manifests, the collective group): where adding a weights mode may have to look.
- `token_field_files`: files whose code names `rollout_logp`, a per-token field that every
  record of an answer carries: what adding a field like it touches today.
- `callable_fields`, `lambdas`, `fmt_skips`, `twice_defined_classes`: in grpo/.
- `duplicate_pairs`: the `duplicates` tool's count of pairs in grpo/, where it is installed.

The call graph is static and approximate by design: a name a function loads resolves to the
grpo definition it was imported as or defined beside; `self.x` to its class's method (or a
base's); any other `.x` to every method of that name in grpo when there are at most
`_FANOUT` of them (an interface and its implementations), else to none (a name as common as
`get` says nothing of where the path goes).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
from collections import defaultdict
from pathlib import Path

PLUMBING = ("grpo/core/", "grpo/config/", "grpo/runtime/", "grpo/observe/", "grpo/wire/")
MATHS = ("grpo/algos/",)
_FANOUT = 1
# A function is named "file:Class.method"; each place is the first of its names defined (so
# the counts run on commits from before a rename).
Place = tuple[str, ...]
SERVE = (
    "grpo/weights/in_use.py:WeightsInUse.serve",
    "grpo/sampler/weights.py:Weights.wait_for_version",
)
CONSUMERS = (
    ("grpo/weights/in_use.py:PolicyCopy.load", "grpo/sampler/weights.py:Weights.load_into_policy"),
    ("grpo/rollout/hf_slots.py:HFSlotEngine.load",),
    ("grpo/rollout/vllm_slots.py:VllmSlotEngine.load",),
)
# (mode, trainer end, receiver)
MODES = {
    "files": (
        "grpo/weights/modes/files.py:DirServer",
        "grpo/weights/modes/files.py:FetchingReceiver",
    ),
    "stream": (
        "grpo/weights/modes/stream.py:MemoryServer",
        "grpo/weights/modes/stream.py:StreamReceiver",
    ),
}
HOPS = (  # the announcement, added to the trainer's heartbeats and read from the sampler's;
    # what takes the version at the end (called through a protocol: no static edge)
    ("grpo/weights/publisher.py:Publisher.announced",),
    ("grpo/delivery/trainer_endpoint.py:TrainerEndpoint.__init__",),
    ("grpo/delivery/sampler_endpoint.py:TrainerStatus.take",),
)
STEP = ("grpo/trainer/loop.py:Trainer.step",)
_EXPERIENCE = "grpo/trainer/experience.py"
STAGES = (
    ("grpo/trainer/scoring.py:score_on_ranks",),
    (f"{_EXPERIENCE}:padded_experience", f"{_EXPERIENCE}:build_experience"),
    (f"{_EXPERIENCE}:with_advantages", f"{_EXPERIENCE}:estimate_advantages"),
    ("grpo/trainer/step.py:micro_batch_loss", "grpo/trainer/objective.py:micro_batch_loss"),
)


def legs(mode: str) -> list[tuple[tuple[Place, ...], tuple[Place, ...]]]:
    """A version's way in `mode`: (first functions, last functions) of each leg."""
    end, receiver = MODES[mode]
    return [
        ((("grpo/trainer/loop.py:Trainer.publish",),), (("grpo/weights/dirs.py:publish_version",),
         (f"{end}.published",), ("grpo/weights/publisher.py:Publisher.announced",))),
        ((SERVE,), (("grpo/weights/modes/base.py:Receiver.get",),)),
    ]  # fmt: skip


MODE_NAMES = re.compile(r"\b\w*(relay|manifest|collective|group_state)\w*\b", re.I)
TOKEN_FIELD = re.compile(r"\brollout_logp\b")


def _code_lines(tree: ast.Module, source: str) -> str:
    """The source less its docstrings and comments."""
    lines = source.splitlines()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                for i in range(body[0].lineno - 1, body[0].end_lineno or body[0].lineno):
                    lines[i] = ""
    return "\n".join(re.sub(r"#.*", "", line) for line in lines)


class _Graph:
    """Every grpo function and method (file:qualname) and the grpo names its body loads."""

    def __init__(self, repo: Path):
        self.defs: dict[str, ast.AST] = {}
        self.by_name: dict[str, list[str]] = defaultdict(list)  # method/function name -> ids
        self.bases: dict[str, list[str]] = {}  # class id -> base names
        self.imports: dict[str, dict[str, str]] = {}  # file -> local name -> module file
        self.files = sorted(p.relative_to(repo).as_posix() for p in (repo / "grpo").rglob("*.py"))
        self.trees = {f: ast.parse((repo / f).read_text(), f) for f in self.files}
        for f, tree in self.trees.items():
            self.imports[f] = self._imports_of(tree)
            for node in tree.body:
                self._define(f, node, "")
        self.attrs: dict[str, dict[str, str]] = {}  # class id -> self attribute -> class id
        for ident, node in self.defs.items():
            if isinstance(node, ast.ClassDef):
                self.attrs[ident] = self._attribute_types(ident, node)

    def _imports_of(self, tree: ast.Module) -> dict[str, str]:
        found = {}
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module.startswith("grpo"):
                for a in node.names:
                    found[a.asname or a.name] = node.module.replace(".", "/")
        return found

    def _define(self, f: str, node: ast.AST, prefix: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            ident = f"{f}:{prefix}{node.name}"
            self.defs[ident] = node
            self.by_name[node.name].append(ident)
        elif isinstance(node, ast.ClassDef):
            ident = f"{f}:{prefix}{node.name}"
            self.defs[ident] = node
            self.by_name[node.name].append(ident)
            self.bases[ident] = [b.id for b in node.bases if isinstance(b, ast.Name)]
            for child in node.body:
                self._define(f, child, f"{prefix}{node.name}.")

    def _type_of(self, f: str, annotation: ast.AST | None) -> str | None:
        """The grpo class an annotation or a constructor call names (`X`, `X | None`, "X")."""
        if annotation is None:
            return None
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(annotation, ast.IfExp):
            return self._type_of(f, annotation.body) or self._type_of(f, annotation.orelse)
        if isinstance(annotation, ast.BinOp):
            return self._type_of(f, annotation.left) or self._type_of(f, annotation.right)
        if isinstance(annotation, ast.Call):
            return self._type_of(f, annotation.func)
        if isinstance(annotation, ast.Name):
            found = self._resolve_name(f, annotation.id)
            return found if found in self.bases else None
        return None

    def _attribute_types(self, cls: str, node: ast.ClassDef) -> dict[str, str]:
        """`self.x`'s class, from the class's fields and its methods' `self.x = X(...)` and
        `self.x: X = ...`."""
        f = cls.split(":")[0]
        found: dict[str, str] = {}
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            if t := self._type_of(f, item.annotation):
                found[item.target.id] = t
        for sub in ast.walk(node):
            if isinstance(sub, ast.AnnAssign):
                target, value = sub.target, sub.annotation
            elif isinstance(sub, ast.Assign) and len(sub.targets) == 1:
                target, value = sub.targets[0], sub.value
            else:
                continue
            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "self" and (t := self._type_of(f, value))):  # fmt: skip
                found.setdefault(target.attr, t)
        return found

    def _owner_type(
        self, f: str, cls: str | None, env: dict[str, str], owner: ast.AST
    ) -> str | None:
        if isinstance(owner, ast.Name):
            return cls if owner.id == "self" and cls in self.bases else env.get(owner.id)
        if isinstance(owner, ast.Attribute):
            inner = self._owner_type(f, cls, env, owner.value)
            return self.attrs.get(inner, {}).get(owner.attr) if inner else None
        return None

    def _module_def(self, module: str, name: str) -> str | None:
        for f in (f"{module}.py", f"{module}/__init__.py"):
            if f"{f}:{name}" in self.defs:
                return f"{f}:{name}"
        return None

    def _class_method(self, cls: str, name: str) -> str | None:
        if f"{cls}.{name}" in self.defs:
            return f"{cls}.{name}"
        f = cls.split(":")[0]
        for base in self.bases.get(cls, []):
            found = self._resolve_name(f, base)
            if found and found in self.bases and (m := self._class_method(found, name)):
                return m
        return None

    def _resolve_name(self, f: str, name: str) -> str | None:
        if f"{f}:{name}" in self.defs:
            return f"{f}:{name}"
        if name in self.imports[f]:
            return self._module_def(self.imports[f][name], name)
        return None

    def edges(self, ident: str) -> set[str]:
        node = self.defs[ident]
        f, qual = ident.split(":")
        cls = f"{f}:{qual.rsplit('.', 1)[0]}" if "." in qual else None
        if isinstance(node, ast.ClassDef):  # a class: what building and calling it runs
            return {m for m in (f"{ident}.__init__", f"{ident}.__call__", f"{ident}.__post_init__")
                    if m in self.defs}  # fmt: skip
        env: dict[str, str] = {}
        args = node.args  # type: ignore[attr-defined]
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if t := self._type_of(f, arg.annotation):
                env[arg.arg] = t
        out: set[str] = set()
        for sub in ast.walk(node):
            assigned = isinstance(sub, ast.Assign) and isinstance(sub.targets[0], ast.Name)
            if assigned and (t := self._type_of(f, sub.value)):  # type: ignore[attr-defined]
                env[sub.targets[0].id] = t  # type: ignore[attr-defined]
            if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Load):
                if (target := self._resolve_name(f, sub.id)) is not None:
                    out.add(target)
            elif isinstance(sub, ast.Attribute):
                owner = self._owner_type(f, cls, env, sub.value)
                if owner is not None and (m := self._class_method(owner, sub.attr)):
                    out.add(m)
                    continue
                methods = [m for m in self.by_name.get(sub.attr, []) if "." in m.split(":")[1]]
                if 0 < len(methods) <= _FANOUT:
                    out.update(methods)
        return out - {ident}

    def place(self, names: Place) -> str | None:
        """The first of `names` defined here ("file:Class.method" found on a base too)."""
        for name in names:
            if name in self.defs:
                return name
            f, qual = name.split(":")
            if "." in qual:
                cls, method = qual.rsplit(".", 1)
                if (found := self._class_method(f"{f}:{cls}", method)) is not None:
                    return found
        return None

    def places(self, all_names: tuple[Place, ...]) -> list[str]:
        found = [self.place(names) for names in all_names]
        missing = [names for names, p in zip(all_names, found, strict=True) if p is None]
        if missing:
            raise SystemExit(f"not defined here: {missing} (update scripts/structure_count.py)")
        return [p for p in found if p is not None]

    def _reach(self, starts: list[str], step) -> set[str]:
        seen: set[str] = set()
        todo = list(starts)
        while todo:
            ident = todo.pop()
            if ident not in seen:
                seen.add(ident)
                todo += list(step(ident))
        return seen

    def within(self, sources: list[str], prefix: str) -> set[str]:
        """The functions reachable from `sources` through files under `prefix` alone."""
        return self._reach(sources, lambda i: {e for e in self.edges(i) if e.startswith(prefix)})

    def on_path(self, sources: list[str], targets: list[str]) -> set[str]:
        """The functions on some call path from one of `sources` to one of `targets`."""
        forward = self._reach(sources, self.edges)
        back: dict[str, set[str]] = defaultdict(set)
        for ident in forward:
            for callee in self.edges(ident):
                back[callee].add(ident)
        return forward & self._reach([t for t in targets if t in forward], back.__getitem__)


def _files(idents: set[str], leave_out: tuple[str, ...]) -> list[str]:
    return sorted(f for f in {i.split(":")[0] for i in idents} if not f.startswith(leave_out))


def counts(repo: Path) -> dict[str, object]:
    graph = _Graph(repo)
    out: dict[str, object] = {}
    for mode in MODES:
        crossed = set(graph.places(HOPS + CONSUMERS))
        for first, last in legs(mode):
            crossed |= graph.on_path(graph.places(first), graph.places(last))
        # what the mode's two ends run to serve and to receive, within grpo/weights/
        ends = graph.places(((f"{MODES[mode][0]}.serve",), (f"{MODES[mode][1]}.get",)))
        crossed |= graph.within(ends, "grpo/weights/")
        out[f"version_files_{mode}"] = _files(crossed, PLUMBING)
    step = graph.on_path(graph.places((STEP,)), graph.places(STAGES))
    out["step_files"] = _files(step, PLUMBING + MATHS)
    callables = lambdas = skips = 0
    classes: dict[str, set[str]] = defaultdict(set)
    mode_files, field_files = [], []
    for f, tree in graph.trees.items():
        source = (repo / f).read_text()
        skips += source.count("# fmt: skip")
        code = _code_lines(tree, source)
        if not f.startswith("grpo/weights/") and MODE_NAMES.search(code):
            mode_files.append(f)
        if TOKEN_FIELD.search(code):
            field_files.append(f)
        for node in ast.walk(tree):
            if isinstance(node, ast.Lambda):
                lambdas += 1
            elif isinstance(node, ast.ClassDef):
                classes[node.name].add(f)
                for item in node.body:
                    if isinstance(item, ast.AnnAssign) and "Callable" in ast.unparse(
                        item.annotation
                    ):
                        callables += 1
    out |= {
        "mode_files": mode_files,
        "token_field_files": field_files,
        "callable_fields": callables,
        "lambdas": lambdas,
        "fmt_skips": skips,
        "twice_defined_classes": sorted(n for n, fs in classes.items() if len(fs) > 1),
    }
    if tool := shutil.which("duplicates"):
        said = subprocess.run([tool, "--repo", str(repo / "grpo"), "--seconds", "120"],
                              capture_output=True, text=True).stdout  # fmt: skip
        m = re.search(r"(\d+) pairs?", said)
        out["duplicate_pairs"] = int(m.group(1)) if m else 0 if "no duplicates" in said else said
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--json", action="store_true", help="the counts and their lists")
    args = parser.parse_args()
    found = counts(args.repo.resolve())
    if args.json:
        print(json.dumps(found, indent=1))
        return
    for key, value in found.items():
        shown = f"{len(value)}  ({', '.join(value)})" if isinstance(value, list) else value
        print(f"{key:24} {shown}")


if __name__ == "__main__":
    main()
