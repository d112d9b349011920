"""The embedded model's conversion parses its GGUF once (grpo/models/convert.py); the
conversion itself runs for every session's first use of the model (tests/conftest.py)."""

import gguf
import pytest

from grpo.models.convert import _gguf_parsed_once


class _Reader:
    def __init__(self, path: str):
        self.path = path


def test_within_the_block_the_file_is_parsed_once_and_after_it_gguf_is_as_it_was(monkeypatch):
    monkeypatch.setattr(gguf, "GGUFReader", _Reader)
    name_map = gguf.get_tensor_name_map
    with _gguf_parsed_once():
        first = gguf.GGUFReader("model.gguf")
        assert gguf.GGUFReader("model.gguf") is first  # the tokenizer's, config's and weights'
        assert gguf.GGUFReader("other.gguf") is not first
        arch = gguf.MODEL_ARCH.LLAMA
        assert gguf.get_tensor_name_map(arch, 2) is gguf.get_tensor_name_map(arch, 2)
    assert gguf.GGUFReader is _Reader and gguf.get_tensor_name_map is name_map
    with pytest.raises(RuntimeError), _gguf_parsed_once():
        raise RuntimeError("a failed conversion")
    assert gguf.GGUFReader is _Reader and gguf.get_tensor_name_map is name_map
