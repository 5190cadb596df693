"""Chat templates: rendered as transformers renders them, assistant spans located by the documented rule."""

from __future__ import annotations

import json

import pytest

from nanoset.errors import NanosetError
from nanoset.tokenize.chat_template import ChatRenderer, ChatRenderError, ChatTemplate, load_chat_template
from tests.support import TOKENIZER

CHATML = json.loads((TOKENIZER / "tokenizer_config.json").read_text())["chat_template"]
LLAMA3 = (  # Meta-Llama-3-8B-Instruct's template, verbatim
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
    "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! "},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]


def renderer(source: str, **special: str) -> ChatRenderer:
    return ChatRenderer(ChatTemplate(source, "test"), special)


def test_chatml_rendering_and_spans():
    text, spans = renderer(CHATML).render_with_spans(CONVERSATION)
    assert text == ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                    "<|im_start|>assistant\nHello! <|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n4<|im_end|>\n")
    assert [text[a:b] for a, b in spans] == ["Hello! <|im_end|>\n", "4<|im_end|>\n"]


def test_llama3_rendering_trims_and_spans_follow():
    r = renderer(LLAMA3, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    text, spans = r.render_with_spans(CONVERSATION)
    assert text == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                    "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>")
    assert [text[a:b] for a, b in spans] == ["Hello!<|eot_id|>", "4<|eot_id|>"]  # the template trimmed "Hello! "


def test_empty_assistant_content_trains_only_the_end_of_turn():
    text, spans = renderer(CHATML).render_with_spans([{"role": "user", "content": "x"},
                                                      {"role": "assistant", "content": ""}])
    assert [text[a:b] for a, b in spans] == ["<|im_end|>\n"]


def test_content_equal_to_header_text_is_found_after_the_header():
    text, spans = renderer(CHATML).render_with_spans([{"role": "user", "content": "assistant"},
                                                      {"role": "assistant", "content": "assistant"}])
    assert spans == [(len(text) - len("assistant<|im_end|>\n"), len(text))]


def test_template_closing_a_turn_only_when_another_follows_locates_content_after_the_header():
    """``{% if not loop.last %}``: render(messages[:i]) ends before the user's closing tag and the generation
    prompt is no prefix of the whole, so the search for the content began inside '</user>\n<assistant>' and
    matched the header's own text (content 'assistant'), or trained the header (empty content); the header is
    now what the template writes before a placeholder content."""
    template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if not loop.last %}</{{ m.role }}>\n"
                "{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    r = renderer(template)
    for content in ("assistant", ""):
        text, spans = r.render_with_spans([{"role": "user", "content": "x"}, {"role": "assistant", "content": content}])
        assert spans == [(len("<user>x</user>\n<assistant>"), len(text))]
    # the end-of-turn text such a template writes only when another message follows is trained too (it
    # was left out: render(messages[:i+1]) stops right after the content)
    text, spans = r.render_with_spans([{"role": "user", "content": "x"}, {"role": "assistant", "content": "a"},
                                       {"role": "user", "content": "more"}, {"role": "assistant", "content": "b"}])
    assert text == "<user>x</user>\n<assistant>a</assistant>\n<user>more</user>\n<assistant>b"
    assert [text[a:b] for a, b in spans] == ["a</assistant>\n", "b"]


def test_template_closing_every_conversation_phi3():
    """Phi-3's template writes eos_token after the last message unless a generation prompt follows, so
    render(messages[:i]) was never a prefix of the whole and every conversation was refused; that closing
    (the rendering of no messages) now ends the whole only, trained after a final assistant turn."""
    phi3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
            "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
            "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
            "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}"
            "{% endif %}")
    r = renderer(phi3, eos_token="<|endoftext|>")
    text, spans = r.render_with_spans(CONVERSATION)
    assert text == ("<|system|>\nYou are terse.<|end|>\n<|user|>\nHi there<|end|>\n<|assistant|>\nHello! <|end|>\n"
                    "<|user|>\n2+2?<|end|>\n<|assistant|>\n4<|end|>\n<|endoftext|>")
    assert [text[a:b] for a, b in spans] == ["Hello! <|end|>\n", "4<|end|>\n<|endoftext|>"]
    text, spans = r.render_with_spans(CONVERSATION[:3] + [{"role": "user", "content": "more"}])
    assert text.endswith("<|user|>\nmore<|end|>\n<|endoftext|>")
    assert [text[a:b] for a, b in spans] == ["Hello! <|end|>\n"]


def test_same_text_as_transformers():
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(TOKENIZER / "tokenizer.json")),
                                              bos_token="<|begin_of_text|>", eos_token="<|endoftext|>")
    specials = {"bos_token": "<|begin_of_text|>", "eos_token": "<|endoftext|>"}
    extras = ("{{ messages | tojson }}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
              "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}{% set ns = namespace(n=0) %}{{ ns.n }}")
    for template in (CHATML, LLAMA3, extras):
        msgs = CONVERSATION + [{"role": "user", "content": "<b>é & 日本</b>"}]
        assert renderer(template, **specials).render(msgs) == hf.apply_chat_template(
            msgs, chat_template=template, tokenize=False)


def test_raise_exception_is_a_row_error():
    template = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                "{% endif %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(ChatRenderError, match="^the chat template raised: Conversation roles must alternate"):
        renderer(template).render_with_spans([{"role": "assistant", "content": "a"}])


def test_template_whose_earlier_turns_depend_on_later_ones_is_refused():
    template = "{{ messages | length }}:{% for m in messages %}{{ m['content'] }};{% endfor %}"
    with pytest.raises(ChatRenderError, match=r"renders messages\[:1\] differently alone than inside the whole"):
        renderer(template).render_with_spans([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                                              {"role": "user", "content": "q2"}])


def test_template_that_drops_the_content_is_refused():
    template = "{% for m in messages %}{{ m['role'] }};{% endfor %}"
    with pytest.raises(ChatRenderError, match="does not write assistant message 1's content as given"):
        renderer(template).render_with_spans([{"role": "user", "content": "q"}, {"role": "assistant", "content": "zz"}])


def test_template_lookup(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    cfg = tmp_path / "tokenizer_config.json"
    with pytest.raises(NanosetError, match=r"no chat template \(no chat_template in .*tokenizer_config.json, no "
                                           r"chat_template.jinja beside it\); pass --chat-template FILE"):
        load_chat_template(tmp_path / "tokenizer.json")
    (tmp_path / "chat_template.jinja").write_text("J")
    assert load_chat_template(tmp_path / "tokenizer.json").source == "J"
    cfg.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "T"},
                                                 {"name": "default", "template": "D"}]}))
    assert load_chat_template(tmp_path / "tokenizer.json").source == "J"  # the .jinja file wins, as in transformers
    (tmp_path / "chat_template.jinja").unlink()
    assert load_chat_template(tmp_path / "tokenizer.json").source == "D"
    cfg.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "T"}]}))
    with pytest.raises(NanosetError, match="chat_template holds templates named \\['tool_use'\\] but none named"):
        load_chat_template(tmp_path / "tokenizer.json")
    (tmp_path / "mine.jinja").write_text("M")
    assert load_chat_template(tmp_path / "tokenizer.json", tmp_path / "mine.jinja").source == "M"
    with pytest.raises(NanosetError, match="chat template syntax error at template line 1"):
        renderer("{% for %}")


def test_ids_and_mask_equal_transformers_assistant_tokens_mask():
    """transformers marks the tokens of {% generation %} blocks; around each assistant content and its
    end-of-turn text they must be exactly our mask (less the EOS we append)."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    from nanoset.tokenize.backends import TokenizersEncoder
    from nanoset.tokenize.chat import RenderedChat, encode_chats

    tagged = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' }}{% if m['role'] == 'assistant' %}"
              "{% generation %}{{ m['content'] + '<|im_end|>\n' }}{% endgeneration %}{% else %}"
              "{{ m['content'] + '<|im_end|>\n' }}{% endif %}{% endfor %}")
    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    text, spans = renderer(tagged).render_with_spans(CONVERSATION)
    assert text == renderer(CHATML).render(CONVERSATION)
    out = hf.apply_chat_template(CONVERSATION, chat_template=tagged, return_dict=True,
                                 return_assistant_tokens_mask=True)
    ids, loss, _ = encode_chats(TokenizersEncoder(tok), [RenderedChat(text, tuple(spans), True)], eos_id=0)
    assert ids[:-1].tolist() == out["input_ids"] and loss[:-1].tolist() == out["assistant_masks"]
    # "H" "ell" "o" "!" "Ġ" <|im_end|> "\n", "4" <|im_end|> "\n"
    assert ids[-1] == 0 and loss[-1] == 1 and sum(out["assistant_masks"]) == 10


LLAMA2_CHAT = (  # meta-llama/Llama-2-7b-chat-hf's template, verbatim
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
    "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
    "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + "
        "'<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
        "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}"
        "{% endif %}")
LOOP_LAST = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if not loop.last %}</{{ m.role }}>\n"
             "{% endif %}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>"}


def exchanges(n: int, system: bool = True) -> list[dict]:
    """A conversation of ``n`` user/assistant exchanges (contents that repeat, trim and hold header text)."""
    out = [{"role": "system", "content": "Be brief."}] if system else []
    for k in range(n):
        out += [{"role": "user", "content": f"question {k % 3} assistant"},
                {"role": "assistant", "content": [" yes ", "assistant", f"answer {k}", ""][k % 4]}]
    return out


@pytest.mark.parametrize("name, template, linear", [
    ("chatml", CHATML, True), ("llama-3", LLAMA3, True), ("llama-2", LLAMA2_CHAT, True), ("phi-3", PHI3, True),
    ("loop.last", LOOP_LAST, False),
])
def test_spans_from_two_traced_renders_equal_the_prefix_rule(name, template, linear):
    """The one-pass location gives exactly the spans of the documented rule (prefix renders), or declines."""
    from nanoset.tokenize.chat_spans import _by_prefixes, _by_tracing

    r = renderer(template, **SPECIALS)
    for conversation in (exchanges(1), exchanges(5), exchanges(6, system=False), exchanges(3)[:-1]):
        slow = _by_prefixes(r, conversation)
        fast = _by_tracing(r, conversation)
        assert (fast is not None) == linear, conversation
        assert fast is None or fast == slow, conversation


def test_locating_spans_is_linear_in_the_number_of_turns(monkeypatch):
    """Spans came from ~5 renders of prefixes per assistant turn: 1,000 messages took 2.1 s. Counted here:
    the renders and the messages they render, for 8 and for 64 exchanges."""
    from nanoset.tokenize import chat_template

    counted = {"renders": 0, "messages": 0}
    real = chat_template.ChatRenderer._generate

    def counting(self, messages, add_generation_prompt):
        counted["renders"] += 1
        counted["messages"] += len(messages)
        return real(self, messages, add_generation_prompt)

    monkeypatch.setattr(chat_template.ChatRenderer, "_generate", counting)
    cost = {}
    for n in (8, 64):
        r = renderer(CHATML)
        r.render([])  # the template's closing: once per template, not per conversation
        counted.update(renders=0, messages=0)
        text, spans = r.render_with_spans(exchanges(n))
        assert len(spans) == n and text == r.render(exchanges(n))
        cost[n] = dict(counted)
    assert cost[8]["renders"] == cost[64]["renders"] <= 6
    assert cost[64]["messages"] <= 8.5 * cost[8]["messages"], cost  # the prefix renders: ~64 times
