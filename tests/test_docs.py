"""The docs stay true to the code: the generated configuration reference is current, the README
keeps its shape (the two commands first, at most 200 lines, no dates) and no relative link in
README.md or docs/ points to a missing file."""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import config_reference as reference

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
CONFIGURATION = DOCS / "configuration.md"

# CI (.ci/run) and users run exactly these; the README opens with them.
COMMANDS = [
    "bash scripts/setup.sh --vllm && bash launch.sh configs/cpu_demo.yaml",
    "bash scripts/setup.sh --dev && .venv/bin/python -m pytest -q",
]
MAX_README_LINES = 200

_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_DATE = re.compile(r"\b(?:19|20)\d\d-\d\d-\d\d\b")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    anchors = set()
    for heading in re.findall(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", text, re.MULTILINE):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _relative_links(page: Path) -> list[str]:
    """The targets of the page's markdown links that are paths, code blocks and spans aside."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", page.read_text(encoding="utf-8")))
    targets = _LINK.findall(text)
    return [t for t in targets if not re.match(r"^(?:[a-z][a-z0-9+.-]*:|#)", t, re.IGNORECASE)]


def test_configuration_reference_is_generated_from_the_code():
    expected = reference.markdown()
    actual = CONFIGURATION.read_text(encoding="utf-8") if CONFIGURATION.exists() else ""
    if actual != expected:
        diff = difflib.unified_diff(
            actual.splitlines(), expected.splitlines(),
            "docs/configuration.md", "scripts.config_reference.markdown()", lineterm="", n=1,
        )  # fmt: skip
        pytest.fail(
            "docs/configuration.md is out of date with the config dataclasses or the registries; "
            f"regenerate it with\n    {reference.REGENERATE}\n" + "\n".join(list(diff)[:60])
        )


def test_the_reference_module_prints_the_page():
    out = subprocess.run(
        [sys.executable, "-m", "scripts.config_reference"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert out.stdout == reference.markdown()


def test_the_reference_lists_every_key_and_the_loss_defaults():
    page = reference.markdown()
    for key in ("name", "model.lora.target_modules", "rollout.vllm.reload", "transport.curve_dir"):
        assert f"| `{key}` |" in page, key
    # The signature defaults, as the losses declare them (GSPO's paper values).
    assert (
        "| `gspo` | `grpo.algos.losses.clipped.gspo_policy_loss` | `seq-mean-token-mean` |" in page
    )
    assert "## Advantage estimators" in page and "| `gae` |" in page
    assert "| `gsm8k` |" in page and "| `vllm` | `grpo.rollout.vllm_slots:build` |" in page


def test_readme_opens_with_the_two_commands_and_stays_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move detail to docs/"
    )
    assert lines[0].startswith("# ") and lines[1] == "", "README.md opens with its title line"
    assert lines[2].startswith("```"), "the title is followed by the fenced block of commands"
    end = lines.index("```", 3)
    block = lines[3:end]
    commands = [line.partition("#")[0].strip() for line in block]
    assert commands == COMMANDS, (
        "README.md's first code block must hold exactly the two commands CI and users run:\n"
        + "\n".join(COMMANDS)
    )


def test_readme_has_no_dates():
    dates = _DATE.findall(README.read_text(encoding="utf-8"))
    assert not dates, f"README.md holds dates {dates}: dated numbers go to docs/benchmarks.md"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_point_to_existing_files(page):
    missing = []
    for target in _relative_links(page):
        path = target.split("#", 1)[0]
        if path and not (page.parent / path).exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(REPO)} links to missing files: {missing}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_anchors_name_existing_headings(page):
    broken = []
    for target in _relative_links(page):
        path, sep, anchor = target.partition("#")
        linked = page.parent / path if path else page
        if sep and linked.suffix == ".md" and linked.exists() and anchor not in _anchors(linked):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)} links to headings that do not exist: {broken}"


def test_readme_links_every_docs_page():
    linked = {
        (README.parent / t.split("#", 1)[0]).resolve()
        for t in _relative_links(README)
        if t.split("#", 1)[0]
    }
    unlinked = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"README.md links to no docs/ page named {unlinked}"


def undocumented_metrics(keys: set[str]) -> list[str]:
    """The keys of real metrics rows that docs/outputs.md does not name, as `key` or as a
    pattern such as `accuracy/<name>` (tests/test_integration.py asks it of a run's rows)."""
    spans = set(re.findall(r"`([^`\n]+)`", (DOCS / "outputs.md").read_text(encoding="utf-8")))
    patterns = [re.compile(re.sub(r"<[^>]+>", "[^/]+", re.escape(s).replace(r"\<", "<")
                                  .replace(r"\>", ">")) + "$")
                for s in spans if "<" in s]  # fmt: skip
    return sorted(k for k in keys if k not in spans and not any(p.match(k) for p in patterns))


def _layouts() -> list[tuple[int, list[str]]]:
    """docs/gpus.md's layout table: (GPUs, the overrides its config column names), placeholders
    (`[k]`, `i`) and ROLE= left out."""
    rows = re.findall(r"^\| (\d+) \| (.+?) \|", (DOCS / "gpus.md").read_text(), re.MULTILINE)
    layouts = []
    for gpus, column in rows:
        words = " ".join(re.findall(r"`([^`]+)`", column)).split()
        overrides = [w for w in words if re.fullmatch(r"[a-z_]+(\.[a-z_]+)+=[\w.-]+", w)
                     and not w.endswith(("=i", "-i"))]  # fmt: skip
        layouts.append((int(gpus), overrides))
    return layouts


@pytest.mark.parametrize("gpus,overrides", _layouts())
def test_every_gpu_layout_in_the_docs_is_accepted_by_the_shipped_config(gpus, overrides):
    """Each row of docs/gpus.md's table, applied to configs/gsm8k_grpo.yaml, passes the config
    checks and places both roles on that many GPUs (a row once asked for 7 ranks, which no
    shipped config's 16 questions per step allows)."""
    from grpo.config import load_config
    from grpo.runtime.placement import placement_for

    cfg = load_config(REPO / "configs" / "gsm8k_grpo.yaml", overrides)
    placed = placement_for(cfg, "both", gpus)
    assert len(placed.trainer) == cfg.train.num_ranks


def test_the_readme_s_cpu_shrink_applies_to_every_gsm8k_config():
    """The shipped configs send a CPU user to README's "Algorithms" for how to shrink them."""
    from grpo.config import load_config

    shrink = re.search(r"On CPU shrink one as the demo is:\s+`([^`]+)`", README.read_text())
    assert shrink, "README's Algorithms section lost its CPU line"
    configs = [p for p in sorted((REPO / "configs").glob("*.yaml"))
               if '"Algorithms" in README.md' in p.read_text()]  # fmt: skip
    assert len(configs) >= 8
    for path in configs:
        cfg = load_config(path, shrink.group(1).split())
        assert cfg.rollout.questions_per_step == 4 and cfg.train.num_ranks == 1


def test_the_bash_the_docs_ask_for_is_the_one_launch_sh_checks_for():
    """Issue 64, item 9: docs/running.md asked for bash 4, while launch.sh's supervisor needs
    5.1 (`wait -n -p`); launch.sh now refuses an older bash up front, and the two agree."""
    script = (REPO / "launch.sh").read_text()
    checked = re.search(r"BASH_VERSINFO\[1\] < (\d+)(\d\d) \)\)", script)
    said = re.search(r"needs bash (\d+)\.(\d+) or newer", script)
    asked = re.search(r"bash (\d+)\.(\d+) or newer", (DOCS / "running.md").read_text())
    assert checked and said and asked
    want = (int(checked.group(1)), int(checked.group(2)))
    assert (int(said.group(1)), int(said.group(2))) == want == (int(asked.group(1)),
                                                                 int(asked.group(2)))  # fmt: skip
    assert "wait -n -p" in script and want >= (5, 1)


def test_every_key_the_trl_and_verl_mapping_names_is_ours():
    """docs/running.md's table maps TRL's and verl's knobs to ours: each key in our column
    exists (a renamed key would leave the table pointing nowhere)."""
    from functools import reduce

    from grpo.config import load_config

    text = (DOCS / "running.md").read_text()
    table = text.split("## Coming from TRL or verl", 1)[1].split("\n## ", 1)[0]
    ours = [row.rsplit("|", 2)[1] for row in table.splitlines() if row.startswith("| ")][1:]
    keys = {k for cell in ours for k in re.findall(r"`([a-z_]+\.[a-z_.]+)", cell)}
    assert len(keys) >= 25, keys
    cfg = load_config(None, [])
    missing = []
    for key in sorted(keys):
        try:
            reduce(getattr, key.split("."), cfg)
        except AttributeError:
            missing.append(key)
    assert not missing, f"docs/running.md names keys the config does not have: {missing}"


def test_the_demo_s_durations_are_quoted_from_the_benchmarks_alone():
    """Issue 64, item 9: README and the demo's config disagreed on how long the demo takes, and
    README's float32 figure had been guessed. Durations live in docs/benchmarks.md: each one
    README's opening quotes is a measured row there, in bold, and the config quotes none (it
    sends the reader to README)."""
    opening = README.read_text(encoding="utf-8").split("\n## ", 1)[0]
    quoted = re.findall(r"\b(\d+ min \d+ s)\b", opening)
    assert quoted, "README's opening gives the demo's duration as measured (N min M s)"
    assert not re.search(r"\b\d+ minutes\b|\babout \d+ in float32", opening), (
        "README's opening rounds the demo's duration: quote docs/benchmarks.md's row"
    )
    bench = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    unmeasured = [q for q in quoted if f"**{q}**" not in bench]
    assert not unmeasured, f"README quotes durations docs/benchmarks.md has no row of: {unmeasured}"
    demo = (REPO / "configs" / "cpu_demo.yaml").read_text(encoding="utf-8")
    comments = " ".join(line.strip().lstrip("#").strip() for line in demo.splitlines())
    assert "how long it takes on 2 cores: README" in comments
    assert not re.search(r"\b\d+ (?:min|minutes)\b", demo), "the demo config quotes a duration"


def test_the_demo_s_answer_form_is_the_one_the_reward_pays():
    """README's demo example (its v8 answer) is what the demo's reward calls worked and right:
    the issue found README saying the answers *end* with `#### N` while they began with it."""
    from grpo.tasks import get_task

    text = README.read_text(encoding="utf-8")
    example = re.search(r"Its v8:\n\n((?:    .+\n)+)", text)
    assert example, "README's demo example (indented, after 'Its v8:') is gone"
    answer = "\n".join(line[4:] for line in example.group(1).splitlines())
    total = re.search(r"(\d+) \+ (\d+) = (\d+)", answer)
    assert total and int(total.group(1)) + int(total.group(2)) == int(total.group(3))
    task = get_task("addition")
    row = {"question": "", "answer": f"working\n#### {total.group(3)}"}
    reward = task.reward(answer, row)
    score, info = reward if isinstance(reward, tuple) else (reward, {})
    assert score == 1.0 and info.get("formatted") and info.get("correct"), (score, info)
