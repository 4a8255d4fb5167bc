"""Drives `cmpl --serve` with the official SDKs, as an app written for the
hosted API would: the together SDK (sync, async, strict response
validation; it takes the server root) and the OpenAI SDK (root + /v1).
argv: ROOT_URL MODEL FRANCE_6 FRANCE_STOP, the last two the command line's
greedy answers on this machine (6 tokens; 30 with stop "."), which the
server must give exactly. Prints "ok" or fails loudly."""
import asyncio, sys
from together import AsyncTogether, Together
from openai import OpenAI

root, model, FRANCE_6, FRANCE_STOP = sys.argv[1:5]
prompt = "The capital of France is"


def check_completion(c, n=1, echo=False, logprobs=None):
    assert len(c.choices) == n, c
    for choice in c.choices:
        assert isinstance(choice.text, str) and choice.finish_reason in ("stop", "eos", "length"), choice
        if logprobs is not None:
            assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs), choice
    assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
    if echo:
        assert c.prompt[0].text == prompt, c.prompt


for strict in (False, True):
    client = Together(base_url=root, api_key="unused", _strict_response_validation=strict, max_retries=0)
    c = client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0, seed=3)
    check_completion(c)
    assert c.choices[0].text == FRANCE_6, c.choices[0].text
    assert c.choices[0].seed == 3
    c = client.completions.create(model="some/other-model", prompt=prompt, max_tokens=4, n=2, seed=9, temperature=1)
    check_completion(c, n=2)
    assert c.model == "some/other-model", "the model asked for is echoed back"
    if not strict:
        # The SDK's strict types take top_logprobs as one object and no null
        # logprob; the contract sends one object per position and null for the
        # first echoed token, which the SDK reads fine unvalidated.
        c = client.completions.create(model=model, prompt=prompt, max_tokens=4, logprobs=2, echo=True, temperature=0)
        check_completion(c, echo=True, logprobs=2)
    c = client.completions.create(model=model, prompt=prompt, max_tokens=30, stop=["."], temperature=0)
    assert c.choices[0].text == FRANCE_STOP and c.choices[0].finish_reason == "stop", c
    text = ""
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0, stream=True):
        assert chunk.choices[0].delta.role == "assistant"
        text += chunk.choices[0].text
    assert text == FRANCE_6, text


async def run_async():
    client = AsyncTogether(base_url=root, api_key="unused", max_retries=0)
    c = await client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0)
    check_completion(c)
    text = ""
    async for chunk in await client.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0, stream=True):
        text += chunk.choices[0].text
    assert text == FRANCE_6, text

asyncio.run(run_async())

openai = OpenAI(base_url=root + "/v1", api_key="unused", max_retries=0)
c = openai.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0, seed=1, logprobs=2, echo=True)
assert c.choices[0].text == FRANCE_6, c
assert len(c.choices[0].logprobs.top_logprobs[-1]) == 2
text = "".join(ch.choices[0].text for ch in openai.completions.create(
    model=model, prompt=prompt, max_tokens=6, temperature=0, stream=True))
assert text == FRANCE_6, text
c = openai.completions.create(model=model, prompt=prompt, max_tokens=3, n=3, stop=["\n"])
assert len(c.choices) == 3
print("ok")
