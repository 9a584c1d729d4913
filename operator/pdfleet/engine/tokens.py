"""Cheap deterministic tokenizer stand-in and the emulator's generated text.

Counting rule: one token per 4 characters of text, rounded up (BPE tokenizers average ~4 characters of English per
token). A prompt given as token ids counts one token per id. Chat prompts add a fixed template cost per message.
Generated token i is the word WORDS[i % len(WORDS)] followed by a space, so output text is predictable in tests.
"""

from __future__ import annotations

from typing import Any

CHARS_PER_TOKEN = 4
CHAT_TOKENS_PER_MESSAGE = 4  # role header and separators of a chat template
CHAT_TOKENS_PER_PROMPT = 3  # assistant turn header appended by add_generation_prompt
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")


def count_text_tokens(text: str) -> int:
    """Tokens in `text` under the 4-characters-per-token rule."""
    return -(-len(text) // CHARS_PER_TOKEN)


def prompt_tokens(prompt: Any) -> int:
    """Tokens of a /v1/completions `prompt`: a string, a list of token ids, or a one-element list of either.

    Raises ValueError for anything else (several prompts in one request are not emulated).
    """
    if isinstance(prompt, str):
        return count_text_tokens(prompt)
    if isinstance(prompt, list):
        if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return len(prompt)
        if len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            return prompt_tokens(prompt[0])
    raise ValueError("prompt must be a string, a list of token ids, or a list holding one of those")


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    raise ValueError("message content must be a string or a list of content parts")


def chat_prompt_tokens(messages: Any) -> int:
    """Tokens of a chat prompt: each message's content plus a per-message template cost, plus the assistant header."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    total = CHAT_TOKENS_PER_PROMPT
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError("each message must be an object")
        total += CHAT_TOKENS_PER_MESSAGE + count_text_tokens(_content_text(message.get("content")))
    return total


def token_text(index: int) -> str:
    """Text of the generated token at position `index`."""
    return WORDS[index % len(WORDS)] + " "


def generated_text(start: int, count: int) -> str:
    """Text of generated tokens start .. start+count-1."""
    return "".join(token_text(i) for i in range(start, start + count))


def plan_output(max_tokens: int, min_tokens: int, ignore_eos: bool, natural_tokens: int) -> tuple[int, str]:
    """How many tokens a request generates and why it stops.

    The emulated model emits EOS after `natural_tokens` tokens; min_tokens postpones it, ignore_eos suppresses it,
    max_tokens caps everything. Returns (tokens, finish_reason) with finish_reason "stop" (EOS) or "length".
    """
    if ignore_eos:
        return max_tokens, "length"
    eos_at = max(natural_tokens, min_tokens, 1)
    return (eos_at, "stop") if eos_at < max_tokens else (max_tokens, "length")
