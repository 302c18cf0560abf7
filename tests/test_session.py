"""The Worker's `sampling` object as pyshim.serve.protocol reads it: stop strings reach the engine."""

from pyshim.serve.protocol import Sampling


def test_sampling_takes_one_stop_string_or_a_list():
    assert Sampling.parse({"stop": "\n"}).stop == ("\n",)
    s = Sampling.parse({"temperature": 0, "max_tokens": 3, "stop": ["a", "bc"]})
    assert (s.params.greedy, s.max_tokens, s.stop) == (True, 3, ("a", "bc"))


def test_sampling_without_stop_has_none():
    assert Sampling.parse({}).stop == () and Sampling.parse({"stop": None}).stop == ()


def test_max_completion_tokens_means_max_tokens():
    assert Sampling.parse({"max_completion_tokens": 9}).max_tokens == 9
