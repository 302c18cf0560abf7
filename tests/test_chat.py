"""Chat templates: rendering, fallbacks, sandboxing, stop ids."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pyshim.text.chat import CHATML, GEMMA, ChatTemplate, fallback_template
from pyshim.errors import ChatTemplateError
from pyshim.gguf.header import read_header_from_file
from pyshim.text.tokenizer import Tokenizer
from pyshim.text.tokenizer.unicode import BYTE_TO_CHAR

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(Path(__file__).parent))
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi ü"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
]


def chatml_tokenizer(**extra) -> tuple[dict, Tokenizer]:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = list(BYTE_TO_CHAR) + specials
    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
                "tokenizer.ggml.token_type": [1] * 256 + [3] * len(specials), "tokenizer.ggml.merges": [],
                "tokenizer.ggml.bos_token_id": 256, "tokenizer.ggml.eos_token_id": 258, **extra}
    return metadata, Tokenizer.from_metadata(metadata)


def test_file_template_renders_with_hf_conventions():
    source = ("{% for m in messages %}\n{{ m.role }}={{ m.content | tojson }}\n  {% endfor %}"
              "{% if add_generation_prompt %}>{% endif %}{{ eos_token }}")
    metadata, tok = chatml_tokenizer(**{"tokenizer.chat_template": source})
    template = ChatTemplate.from_metadata(metadata, tok)
    assert template.from_file
    # trim_blocks/lstrip_blocks drop the tag lines; tojson keeps non-ASCII text
    assert template.render(MESSAGES[1:2]) == 'user="Hi ü"\n><|im_end|>'
    assert template.render(MESSAGES[1:2], add_generation_prompt=False) == 'user="Hi ü"\n<|im_end|>'


def test_chatml_fallback_and_stop_ids():
    metadata, tok = chatml_tokenizer()
    template = ChatTemplate.from_metadata(metadata, tok)
    assert not template.from_file and template.source == CHATML
    assert template.render(MESSAGES[1:2]) == "<|im_start|>user\nHi ü<|im_end|>\n<|im_start|>assistant\n"
    assert tok.token_id("<|im_end|>") in template.stop_ids
    ids = template.encode(tok, MESSAGES[1:2])
    assert ids[0] == tok.token_id("<|im_start|>") and ids.count(tok.token_id("<|im_end|>")) == 1


def test_raise_exception_and_bad_templates():
    metadata, tok = chatml_tokenizer()
    refusing = ChatTemplate.from_metadata(metadata, tok, override="{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        refusing.render(MESSAGES)
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate.from_metadata(metadata, tok, override="{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="role"):
        ChatTemplate.from_metadata(metadata, tok).render([{"content": "no role"}])


@pytest.mark.parametrize("source", [
    "{{ messages.__class__.__mro__ }}",                       # no Python internals
    "{{ messages.append({'role': 'x'}) }}",                   # no mutation of the caller's data
    "{{ ''.__class__.__subclasses__() }}",
])
def test_sandbox(source):
    metadata, tok = chatml_tokenizer()
    messages = [dict(m) for m in MESSAGES]
    with pytest.raises(ChatTemplateError):
        ChatTemplate.from_metadata(metadata, tok, override=source).render(messages)
    assert messages == MESSAGES


def test_template_bos_not_doubled():
    metadata, tok = chatml_tokenizer(**{"tokenizer.ggml.add_bos_token": True,
                                        "tokenizer.chat_template": "{{ bos_token }}{{ messages[0].content }}"})
    template = ChatTemplate.from_metadata(metadata, tok)
    assert template.render(MESSAGES[1:2]).startswith("<|endoftext|>")
    ids = template.encode(tok, MESSAGES[1:2])
    assert ids.count(256) == 1 and ids[0] == 256


@pytest.mark.slow
def test_llamacpp_test_templates_render():
    # llama.cpp's collection of real chat templates (Llama 3, Qwen, Mistral, DeepSeek, Gemma, ...):
    # each renders a plain conversation or refuses it with a ChatTemplateError, never anything else.
    import llamacpp_vocabs

    metadata, tok = chatml_tokenizer()
    paths = llamacpp_vocabs.chat_templates()
    assert len(paths) >= 50
    rendered, refused = 0, []
    for path in paths:
        template = ChatTemplate.from_metadata(metadata, tok, override=path.read_text("utf-8"))
        try:
            text = template.render([dict(m) for m in MESSAGES])
        except ChatTemplateError as exc:
            refused.append((path.name, str(exc)))
            continue
        assert "2+2?" in text and "Hello!" in text, path.name
        rendered += 1
    # Gemma 2 refuses system messages by design; firefunction-v2 needs a `functions` variable.
    assert rendered >= len(paths) - 3, refused


def _model(rel: str) -> tuple[dict, Tokenizer]:
    path = ROOT / rel
    if not path.is_file():
        pytest.skip(f"{rel} not placed (run `pyshim setup --test-models`)")
    metadata = read_header_from_file(path).metadata
    return metadata, Tokenizer.from_metadata(metadata)


@pytest.mark.models
def test_gemma3_base_uses_gemma_turns():
    metadata, tok = _model("models/gemma-3-270m-q4_k_m.gguf")
    assert "tokenizer.chat_template" not in metadata
    template = ChatTemplate.from_metadata(metadata, tok)
    assert template.source == GEMMA == fallback_template(tok, "gemma3")
    assert template.render(MESSAGES) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi ü<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\n2+2?<end_of_turn>\n<start_of_turn>model\n")
    ids = template.encode(tok, MESSAGES)
    assert ids[:4] == [tok.bos_id, tok.token_id("<start_of_turn>"), tok.token_id("user"), tok.token_id("\n")]
    assert ids.count(tok.bos_id) == 1
    assert tok.token_id("<end_of_turn>") in template.stop_ids and tok.eos_id in template.stop_ids


@pytest.mark.models
@pytest.mark.parametrize("rel, system", [
    ("models/SmolLM2-135M-Instruct.Q4_1.gguf", "You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
    ("models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."),
])
def test_chatml_models_from_file(rel, system):
    metadata, tok = _model(rel)
    template = ChatTemplate.from_metadata(metadata, tok)
    assert template.from_file
    assert template.render([{"role": "user", "content": "Hi"}]) == (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.token_id("<|im_end|>") in template.stop_ids
