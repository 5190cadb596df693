"""Ids and loss masks equal transformers' ``apply_chat_template(..., return_assistant_tokens_mask=True)``
for templates whose text right before an answer merges into the answer's first token (Llama-2's
``[/INST] `` + content, Mistral v0.1 and v0.3, DeepSeek-V2's ``Assistant: ``): that token predicts the
answer's start after the prompt; with the first-character rule it was never trained.

Each template is written with ``{% generation %}`` around what transformers should mark (the content and
its end-of-turn text, our documented span); the tokenizers are built here in the shape of those models'
(SentencePiece-style BPE with a prepended and replaced ``▁``, a Metaspace BPE with control tokens, and
the fixture's byte-level BPE)."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from nanoset.tokenize.backends import TokenizersEncoder
from nanoset.tokenize.chat import RenderedChat, encode_chats
from nanoset.tokenize.chat_template import ChatRenderer, ChatTemplate
from tests.support import TOKENIZER

transformers = pytest.importorskip("transformers", minversion="5")

CONVERSATION = [
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": "The sum is four."},
    {"role": "user", "content": "Tell me a joke."},
    {"role": "assistant", "content": "The chicken crossed the road."},
]
LLAMA2 = ("{% for message in messages %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + message['content'].strip() + ' [/INST]' }}"
          "{% elif message['role'] == 'assistant' %}{{ ' ' }}{% generation %}"
          "{{ message['content'].strip() + ' ' + eos_token }}{% endgeneration %}{% endif %}{% endfor %}")
MISTRAL_V01 = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
               "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
               "{% generation %}{{ message['content'] + eos_token + ' ' }}{% endgeneration %}{% endif %}{% endfor %}")
MISTRAL_V03 = ("{{- bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}"
               "{{- '[INST] ' + message['content'] + '[/INST]' }}{%- elif message['role'] == 'assistant' %}"
               "{{- ' ' }}{% generation %}{{- message['content'] | trim + eos_token }}{% endgeneration %}"
               "{%- endif %}{%- endfor %}")
DEEPSEEK_V2 = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
               "{{ 'User: ' + message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}"
               "{{ 'Assistant: ' }}{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
               "{% elif message['role'] == 'system' %}{{ message['content'] + '\n\n' }}{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}")
WORDS = [m["content"] for m in CONVERSATION] + ["Hello there, how are you?", "I am fine, thank you."]


def sentencepiece_like(control_tokens: bool) -> Tokenizer:
    """A BPE trained on words marked with ``▁``: Llama-2/Mistral v0.1 style (normalizer prepends ``▁`` and
    turns spaces into it, no pre-tokenizer) or, with ``control_tokens``, Mistral v0.3 style (a Metaspace
    pre-tokenizer; ``[INST]`` and ``[/INST]`` are special tokens)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ?!.,[]/"))
    tok.train_from_iterator(WORDS * 10, trainer)
    if control_tokens:
        tok.add_special_tokens([AddedToken("[INST]", special=True), AddedToken("[/INST]", special=True)])
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    else:
        tok.pre_tokenizer = None
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    return tok


def fixture_bpe() -> Tokenizer:
    return Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))


SHAPES = {  # template, tokenizer, BOS, EOS, whether the text before each answer merges into its first token
    "llama-2": (LLAMA2, lambda: sentencepiece_like(False), "<s>", "</s>", True),
    "mistral-v0.1": (MISTRAL_V01, lambda: sentencepiece_like(False), "<s>", "</s>", False),
    "mistral-v0.3": (MISTRAL_V03, lambda: sentencepiece_like(True), "<s>", "</s>", True),
    "deepseek-v2": (DEEPSEEK_V2, fixture_bpe, "<|im_start|>", "<|endoftext|>", True),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_ids_and_mask_equal_transformers_assistant_mask(shape):
    template, make, bos, eos, merges = SHAPES[shape]
    tok = make()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
    text, spans = ChatRenderer(ChatTemplate(template, shape), {"bos_token": bos, "eos_token": eos}).render_with_spans(
        CONVERSATION)
    assert text == hf.apply_chat_template(CONVERSATION, chat_template=template, tokenize=False)
    out = hf.apply_chat_template(CONVERSATION, chat_template=template, return_dict=True,
                                 return_assistant_tokens_mask=True)
    eos_id = tok.token_to_id(eos)
    ids, loss, _ = encode_chats(TokenizersEncoder(tok), [RenderedChat(text, tuple(spans), True)], eos_id)
    expected_ids = out["input_ids"] + ([] if out["input_ids"][-1] == eos_id else [eos_id])
    assert ids.tolist() == expected_ids
    assert loss[: len(out["input_ids"])].tolist() == out["assistant_masks"]
    # the first token of each answer: trained, and (where the shape merges) it starts in the template's text
    enc = tok.encode(text, add_special_tokens=False)
    firsts = [next(k for k, (a, b) in enumerate(enc.offsets) if b > start) for start, _ in spans]
    assert [int(loss[k]) for k in firsts] == [1, 1]
    starts_before = [enc.offsets[k][0] < start for k, (start, _) in zip(firsts, spans)]
    assert starts_before == [merges, merges], [(enc.tokens[k], enc.offsets[k]) for k in firsts]
