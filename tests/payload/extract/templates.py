"""Chat templates in the shape of each thinking family, written for these tests.

Each keeps what decides the supervised tokens in its family's real template: where the
reasoning of past and last assistant turns goes, what the generation prompt holds, the
special tokens around a turn. (Tools, images and default system prompts are left out.)

| family | history reasoning | last turn | generation prompt |
|---|---|---|---|
| Kimi K2-Thinking | every turn up to the last without tool calls: EMPTY `<think></think>` | the same (blanked) | `<|im_assistant|>assistant<|im_middle|>` |
| Kimi K2.5 variant | as K2-Thinking | as K2-Thinking | ... `<|im_middle|><think>` |
| Qwen3 | stripped | `<think>\\n…\\n</think>\\n\\n` if after the last user query | `<|im_start|>assistant\\n` |
| Qwen3 thinking-2507 | stripped | as Qwen3 | `<|im_start|>assistant\\n<think>\\n` |
| DeepSeek-R1 | stripped (split at `</think>`) | stripped | `<｜Assistant｜><think>\\n` |
| GLM-4.5 | `<think></think>` | `<think>…</think>` after the last user query; no end-of-turn token | `<|assistant|>` |
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.payload.extract.helpers import build_model, build_tokenizer

SPECIALS = ("<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_middle|>",
            "<|im_end|>", "<|im_start|>", "<｜begin▁of▁sentence｜>", "<｜User｜>",
            "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "[gMASK]", "<sop>")
WORDS = ("assistant", "user", "system")

_KIMI_SPLIT = (
    "{%- set ns = namespace(last=-1) -%}"
    "{%- for i in range(messages|length - 1, -1, -1) -%}"
    "{%- if ns.last == -1 and messages[i].role == 'assistant'"
    " and not messages[i].get('tool_calls') -%}{%- set ns.last = i -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- set hist_msgs = messages[:ns.last + 1] -%}"
    "{%- set suffix_msgs = messages[ns.last + 1:] -%}"
)
_KIMI_ROLE = (
    "{%- if m.role == 'user' -%}<|im_user|>user<|im_middle|>"
    "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- else -%}<|im_system|>{{ m.role }}<|im_middle|>{%- endif -%}"
)


def _kimi(generation_prompt: str) -> str:
    return (
        _KIMI_SPLIT
        + "{%- for m in hist_msgs -%}" + _KIMI_ROLE
        + "{%- if m.role == 'assistant' -%}<think></think>{%- endif -%}"
        "{{ m.content }}<|im_end|>{%- endfor -%}"
        + "{%- for m in suffix_msgs -%}" + _KIMI_ROLE
        + "{%- if m.role == 'assistant' -%}<think>{{ m.reasoning_content or '' }}</think>"
        "{%- endif -%}{{ m.content }}<|im_end|>{%- endfor -%}"
        "{%- if add_generation_prompt -%}" + generation_prompt + "{%- endif -%}"
    )


KIMI_K2_THINKING = _kimi("<|im_assistant|>assistant<|im_middle|>")
KIMI_K25_OPEN = _kimi("<|im_assistant|>assistant<|im_middle|><think>")


def _qwen3(generation_prompt: str) -> str:
    return (
        "{%- set ns = namespace(last_query=-1) -%}"
        "{%- for m in messages -%}{%- if m.role == 'user' -%}"
        "{%- set ns.last_query = loop.index0 -%}{%- endif -%}{%- endfor -%}"
        "{%- for m in messages -%}"
        "{%- if m.role == 'assistant' -%}"
        "{%- set content = m.content -%}"
        "{%- set rc = m.reasoning_content if m.reasoning_content is string else '' -%}"
        "{%- if '</think>' in content -%}"
        "{%- set rc = content.split('</think>')[0].split('<think>')[-1] -%}"
        "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
        "{%- if loop.index0 > ns.last_query and (loop.last or rc) -%}"
        "{{ '<|im_start|>assistant\\n<think>\\n' + rc.strip('\\n') + '\\n</think>\\n\\n'"
        " + content.lstrip('\\n') }}"
        "{%- else -%}{{ '<|im_start|>assistant\\n' + content }}{%- endif -%}"
        "{{ '<|im_end|>\\n' }}"
        "{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{%- endif -%}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '" + generation_prompt + "' }}{%- endif -%}"
    )


QWEN3 = _qwen3("<|im_start|>assistant\\n")
QWEN3_THINKING_2507 = _qwen3("<|im_start|>assistant\\n<think>\\n")

DEEPSEEK_R1 = (
    "{{ bos_token }}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{{ m.content }}"
    "{%- elif m.role == 'user' -%}<｜User｜>{{ m.content }}"
    "{%- elif m.role == 'assistant' -%}{%- set c = m.content -%}"
    "{%- if '</think>' in c -%}{%- set c = c.split('</think>')[-1] -%}{%- endif -%}"
    "<｜Assistant｜>{{ c }}<｜end▁of▁sentence｜>"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<｜Assistant｜><think>\\n' }}{%- endif -%}"
)

GLM45 = (
    "[gMASK]<sop>"
    "{%- set ns = namespace(last_user=-1) -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' -%}"
    "{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'user' -%}{{ '<|user|>\\n' + m.content }}"
    "{%- elif m.role == 'system' -%}{{ '<|system|>\\n' + m.content }}"
    "{%- elif m.role == 'assistant' -%}<|assistant|>"
    "{%- set rc = m.reasoning_content if m.reasoning_content is string else '' -%}"
    "{%- if loop.index0 > ns.last_user and rc -%}{{ '\\n<think>' + rc.strip() + '</think>' }}"
    "{%- else -%}{{ '\\n<think></think>' }}{%- endif -%}"
    "{%- if m.content.strip() -%}{{ '\\n' + m.content.strip() }}{%- endif -%}"
    "{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)


@dataclass(frozen=True)
class Family:
    name: str
    template: str
    eos: str
    bos: str = "<s>"


FAMILIES = {
    "kimi": Family("kimi", KIMI_K2_THINKING, "<|im_end|>"),
    "kimi-open": Family("kimi-open", KIMI_K25_OPEN, "<|im_end|>"),
    "qwen3": Family("qwen3", QWEN3, "<|im_end|>"),
    "qwen3-2507": Family("qwen3-2507", QWEN3_THINKING_2507, "<|im_end|>"),
    "r1": Family("r1", DEEPSEEK_R1, "<｜end▁of▁sentence｜>", bos="<｜begin▁of▁sentence｜>"),
    "glm": Family("glm", GLM45, "<|user|>"),
}


def family_tokenizer(name: str) -> Any:
    f = FAMILIES[name]
    return build_tokenizer(f.template, specials=SPECIALS, words=WORDS, bos=f.bos, eos=f.eos)


def family_model_dir(root: Path, name: str, *, weights: bool = True) -> Path:
    """A model folder with this family's tokenizer: config.json always, the tiny random
    model's weights only when `weights` (without them, a run that loads the model fails:
    what proves a refusal came before the load)."""
    tok = family_tokenizer(name)
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    model = build_model(len(tok))
    if weights:
        model.save_pretrained(d)
    else:
        model.config.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def bpe_tokenizer(template: str = QWEN3) -> Any:
    """A byte-level BPE tokenizer (GPT-2 style, as Qwen's and Kimi's are), trained here:
    whitespace is tokens (`Ċ`, `Ġ`), and one text has several token splits, so a sampled
    split can differ from what re-tokenizing the text gives."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from tests.payload.extract.helpers import WORDS as PLAIN_WORDS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([" ".join(PLAIN_WORDS)] * 5 + [" ".join(WORDS) + "\n\n"] * 5,
                            trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|pad|>", chat_template=template)
