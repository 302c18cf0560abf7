"""pyshim/serve/worker_api.py's request parsing (the site Worker's `sampling` dict): stop strings reach the engine."""

from pyshim.serve.worker_api import sampling_from


def test_sampling_takes_one_stop_string_or_a_list():
    assert sampling_from({"stop": "\n"})[2] == ["\n"]
    params, max_tokens, stops = sampling_from({"temperature": 0, "max_tokens": 3, "stop": ["a", "bc"]})
    assert (params.greedy, max_tokens, stops) == (True, 3, ["a", "bc"])


def test_sampling_without_stop_has_none():
    assert sampling_from({})[2] == [] and sampling_from({"stop": None})[2] == []
