"""Parses cmpl's JSON the way the official Python SDK (together) parses a
server's: each line of stdin is `KIND<TAB>JSON`, KIND being `response` or
`chunk`. Fails loudly on anything the SDK's types do not take."""
import json, sys
from together._models import construct_type
from together.types import Completion
from together.types.completion_chunk import CompletionChunk

for n, line in enumerate(sys.stdin, 1):
    kind, text = line.rstrip("\n").split("\t", 1)
    value = json.loads(text)
    if kind == "response":
        c = construct_type(type_=Completion, value=value)
        assert isinstance(c, Completion), n
        assert c.object == "text.completion" and isinstance(c.created, int), n
        for i, choice in enumerate(c.choices):
            assert choice.text == value["choices"][i]["text"], n
            assert choice.finish_reason in ("stop", "eos", "length"), n
            assert isinstance(choice.seed, int), n
            if choice.logprobs is not None:
                assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs), n
        assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens, n
        for part in c.prompt:
            assert isinstance(part.text, str), n
    elif kind == "chunk":
        c = construct_type(type_=CompletionChunk, value=value)
        assert isinstance(c, CompletionChunk), n
        assert isinstance(c.token.id, int) and isinstance(c.token.logprob, float), n
        assert c.choices[0].delta.role == "assistant", n
        assert c.choices[0].text == value["choices"][0]["text"], n
    else:
        raise SystemExit(f"line {n}: unknown kind {kind}")
print("ok")
