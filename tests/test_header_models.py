"""The header reader on the three real models agrees exactly with gguf.GGUFReader (which maps the
whole file and takes seconds per model), and reads them from prefixes of any length."""

from __future__ import annotations

import pytest
from gguf import GGUFReader

from pyshim.setup.catalog import MODELS, model_path
from pyshim.gguf.header import NeedMoreBytes, read_header, read_header_from_file
from test_header import assert_same_as_reader

pytestmark = [pytest.mark.models, pytest.mark.slow]


def path_of(name: str):
    path = model_path(name)
    if not path.is_file():
        pytest.fail(f"{name} is missing: run `pyshim setup --test-models`")
    return path


@pytest.mark.parametrize("name", list(MODELS))
def test_agrees_with_gguf_reader(name):
    path = path_of(name)
    header = read_header_from_file(path)
    assert header.file_size == MODELS[name].size
    assert_same_as_reader(header, GGUFReader(path))


@pytest.mark.parametrize("name", list(MODELS))
def test_prefixes_converge(name):
    path = path_of(name)
    with open(path, "rb") as f:
        data = f.read(read_header_from_file(path).header_size)
    expected = read_header(data, file_size=MODELS[name].size)
    # what the browser does: start small, fetch max(needed, 2 x what it has)
    have, rounds = 64 << 10, 0
    while True:
        rounds += 1
        try:
            header = read_header(data[:have], file_size=MODELS[name].size)
            break
        except NeedMoreBytes as more:
            assert have < more.needed <= len(data)
            have = min(len(data), max(more.needed, 2 * have))
    assert header.tensors == expected.tensors and rounds <= 8
    assert header.metadata.keys() == expected.metadata.keys()
