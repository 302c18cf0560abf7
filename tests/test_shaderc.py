"""The WGSL preprocessor and the pipeline key (pure Python, no device)."""

from __future__ import annotations

import pytest

from pyshim.errors import ShaderError
from pyshim.gpu.kernels import PARAMS, WEIGHT_TYPES
from pyshim.gpu.shaderc import Preprocessor, ShaderKey, load_sources


def expand(files: dict[str, str], defines=None, main="main.wgsl") -> list[str]:
    return [line for line in Preprocessor(files).expand(main, defines).splitlines() if line.strip()]


def test_ifdef_else_nested_and_defines():
    src = "#ifdef A\na\n#ifndef B\nnot_b\n#else\nb WG\n#endif\n#else\nno_a\n#endif\n#define WG2 WG*2\nwg WG2\n"
    assert expand({"main.wgsl": src}, {"A": "", "B": "", "WG": "64"}) == ["a", "b 64", "wg 64*2"]
    assert expand({"main.wgsl": src}, {"A": "", "WG": "8"}) == ["a", "not_b", "wg 8*2"]
    assert expand({"main.wgsl": src}, {"WG": "8"}) == ["no_a", "wg 8*2"]


def test_substitution_is_whole_word():
    assert expand({"main.wgsl": "N NN xN N_1 N\n"}, {"N": "3"}) == ["3 NN xN N_1 3"]


def test_include_once_and_inside_conditions():
    files = {"main.wgsl": '#include "inc/a.wgsl"\n#include "inc/a.wgsl"\n#ifdef X\n#include "inc/missing.wgsl"\n#endif\nmain\n',
             "inc/a.wgsl": "fn a() {}\n"}
    assert expand(files) == ["fn a() {}", "main"]


def test_unroll_repeats_plain_lines_with_constant_indices():
    src = "#define N ROWS\n#unroll R N\nacc[R] += f(wb[R], RR);\n#endunroll\n#ifdef X\n#unroll R Y\ngone\n#endunroll\n#endif\ntail\n"
    assert expand({"main.wgsl": src}, {"ROWS": "3"}) == ["acc[0u] += f(wb[0u], RR);", "acc[1u] += f(wb[1u], RR);",
                                                          "acc[2u] += f(wb[2u], RR);", "tail"]
    nested = "#unroll I 2\nrow I\n#unroll R ROWS\ns[I][R]\n#endunroll\n#endunroll\n"
    assert expand({"main.wgsl": nested}, {"ROWS": "2"}) == ["row 0u", "s[0u][0u]", "s[0u][1u]", "row 1u", "s[1u][0u]", "s[1u][1u]"]


@pytest.mark.parametrize("src, words", [
    ("#unroll R 2\nx\n", "never closed by #endunroll"),
    ("#endunroll\n", "#endunroll without"),
    ("#unroll R ROWS\nx\n#endunroll\n", "not a number"),
    ("#unroll R 2\n#ifdef A\n#endif\n#endunroll\n", "only plain lines"),
    ("#unroll R 2\n#unroll S N\nx\n#endunroll\n#endunroll\n", "not a number"),

    ("#ifdef A\nx\n", "never closed"),
    ("x\n#endif\n", "#endif without"),
    ("#else\n", "#else without"),
    ("#ifdef A\n#else\n#else\n#endif\n", "#else without"),
    ("#if A\n#endif\n", "malformed or unknown directive"),
    ("#pragma once\n", "malformed or unknown directive"),
    ("#include missing.wgsl\n", "malformed or unknown directive"),
    ('#include "nope.wgsl"\n', "unknown shader file"),
    ("#define 1X 2\n", "malformed or unknown directive"),
])
def test_malformed_input_raises(src, words):
    with pytest.raises(ShaderError, match=words):
        Preprocessor({"main.wgsl": src}).expand("main.wgsl")


def test_include_cycle_raises():
    files = {"main.wgsl": '#include "a.wgsl"\n', "a.wgsl": '#include "b.wgsl"\n', "b.wgsl": '#include "a.wgsl"\n'}
    with pytest.raises(ShaderError, match="include cycle"):
        Preprocessor(files).expand("main.wgsl")


def test_key_is_hashable_and_labels_read_well():
    a = ShaderKey.of("matvec", W_Q4_K=True, WG=64, BIAS=False)
    b = ShaderKey.of("matvec", WG=64, W_Q4_K=True)
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a.label == "matvec_q4_k_wg64"
    assert ShaderKey.of("attention", HD4=16, SOFTCAP=True, WG=64).label == "attention_softcap_hd416_wg64"


def test_every_family_expands_cleanly():
    pre = Preprocessor(load_sources())
    for family in PARAMS:
        for define in (WEIGHT_TYPES[t][0] for t in WEIGHT_TYPES):
            text = pre.expand(f"{family}.wgsl", {define: "", "WG": "64", "ROWS": "2", "HD4": "16", "HDV4": "16", "SPLITS": "1", "PASS1": ""})
            assert "#" not in text.replace("#[", "")     # every directive consumed


def test_enable_lines_head_the_module_per_compiler():
    files = {"main.wgsl": '#include "inc.wgsl"\n#ifdef SG\n#enable subgroups\n#endif\n#ifdef H\n#enable f16\n#endif\nmain\n',
             "inc.wgsl": "#enable f16\nfn a() {}\n"}
    tint = Preprocessor(files).expand("main.wgsl", {"SG": "", "H": ""}).splitlines()
    assert tint[:3] == ["enable f16;", "enable subgroups;", "fn a() {}"] and tint.count("enable f16;") == 1
    naga = Preprocessor(files, compiler="naga").expand("main.wgsl", {"SG": ""}).splitlines()
    assert naga[:2] == ["enable f16;", "fn a() {}"] and "subgroups" not in "".join(naga)
    with pytest.raises(ValueError, match="compiler"):
        Preprocessor(files, compiler="dxc")
    with pytest.raises(ShaderError, match="malformed"):
        Preprocessor({"main.wgsl": "#enable\n"}).expand("main.wgsl")
