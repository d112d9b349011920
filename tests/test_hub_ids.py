"""Hub ids a run names (model.path, data.train): read from the local Hugging Face cache only,
never downloaded (grpo.models.embedded, grpo.tasks.sources). The hub here is a stand-in that
would answer any request, and records each: an offline machine (HF_HUB_OFFLINE, no network)
would make "never downloaded" true whatever the code asked for."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import pytest

from grpo.models.embedded import ModelError, portable_name, require_model_dir
from grpo.tasks.sources import cached_snapshot


class Hub:
    """snapshot_download as a hub that would serve anything: what is "cached" comes back for
    local_files_only, anything else is "downloaded" (recorded) into a fresh dir."""

    def __init__(self, tmp: Path, cached: dict[str, Path]):
        self.tmp, self.cached, self.calls = tmp, cached, []

    def __call__(self, repo_id: str, repo_type: str | None = None,
                 local_files_only: bool = False, **kw) -> str:  # fmt: skip
        self.calls.append((repo_id, repo_type, local_files_only))
        if local_files_only:
            if repo_id not in self.cached:
                raise huggingface_hub.errors.LocalEntryNotFoundError(f"{repo_id} not cached")
            return str(self.cached[repo_id])
        fetched = self.tmp / "downloaded" / repo_id
        (fetched / "data").mkdir(parents=True, exist_ok=True)
        (fetched / "config.json").write_text("{}")
        return str(fetched)


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Hub:
    for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    fake = Hub(tmp_path, {})
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.chdir(tmp_path)
    return fake


def test_a_model_hub_id_is_read_from_the_cache_and_never_downloaded(hub, tmp_path) -> None:
    cached = tmp_path / "snapshots" / "owner" / "model"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    hub.cached["owner/model"] = cached
    assert require_model_dir("owner/model") == cached
    with pytest.raises(ModelError, match="neither a model dir nor a hub id in the local cache"):
        require_model_dir("owner/absent")
    assert all(local for _, _, local in hub.calls) and len(hub.calls) == 2, hub.calls


def test_a_cached_snapshot_without_a_model_config_is_no_model(hub, tmp_path) -> None:
    """A snapshot holding only some files (a tokenizer, a dataset's) is not taken for a model."""
    partial = tmp_path / "snapshots" / "owner" / "tokenizer-only"
    partial.mkdir(parents=True)
    (partial / "tokenizer.json").write_text("{}")
    hub.cached["owner/tokenizer-only"] = partial
    with pytest.raises(ModelError, match="neither a model dir nor a hub id"):
        require_model_dir("owner/tokenizer-only")


def test_a_missing_path_of_three_parts_is_no_hub_id(hub) -> None:
    """owner/name is a hub id; a/b/c that does not exist is a directory that is not there."""
    with pytest.raises(ModelError, match="is not an HF model dir"):
        require_model_dir("runs/owner/model")
    assert hub.calls == []


def test_a_dataset_hub_name_is_looked_up_as_a_dataset_in_the_cache_only(hub, tmp_path) -> None:
    cached = tmp_path / "snapshots" / "owner" / "rows"
    cached.mkdir(parents=True)
    hub.cached["owner/rows"] = cached
    assert cached_snapshot("owner/rows") == cached
    assert cached_snapshot("owner/absent") is None
    assert hub.calls == [("owner/rows", "dataset", True), ("owner/absent", "dataset", True)]


def test_an_adapter_names_a_relative_base_dir_by_its_absolute_path(hub, tmp_path) -> None:
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    assert portable_name("base") == str((tmp_path / "base").resolve())
    assert portable_name("owner/model") == "owner/model" and portable_name("embedded") == "embedded"
