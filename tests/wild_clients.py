"""Drives `cmpl --serve` with completion clients no one here wrote, as their
users run them: the OpenAI SDK with its own options (a string `stop`, `user`,
`stream_options`, a list of prompts), LangChain's OpenAI completion model
(which sends `prompt` as a list, explicit nulls, and batches prompts into one
request), and the `llm` command-line tool with an OpenAI-compatible
completion model. argv: ROOT_URL. Prints "ok" or fails loudly."""
import os, subprocess, sys, tempfile
from openai import OpenAI
from langchain_openai import OpenAI as LangChainOpenAI

root, FRANCE_6, FRANCE_STOP = sys.argv[1:4]
api = root + "/v1"
france = "The capital of France is"
count = "1, 2, 3,"

client = OpenAI(base_url=api, api_key="unused", max_retries=0)
c = client.completions.create(model="m", prompt=france, max_tokens=30, temperature=0, stop=".", user="u1")
assert c.choices[0].text == FRANCE_STOP and c.choices[0].finish_reason == "stop", c
text, usage = "", None
for chunk in client.completions.create(model="m", prompt=france, max_tokens=6, temperature=0, stream=True,
                                       stream_options={"include_usage": True}):
    text += chunk.choices[0].text if chunk.choices else ""
    usage = getattr(chunk, "usage", None) or usage
assert text == FRANCE_6, text
assert usage is not None and usage.completion_tokens == 6, usage
c = client.completions.create(model="m", prompt=[france, count], max_tokens=6, temperature=0, n=2, best_of=2)
assert [ch.index for ch in c.choices] == [0, 1, 2, 3], c
assert c.choices[0].text == c.choices[1].text == FRANCE_6, c
assert c.choices[2].text == c.choices[3].text != FRANCE_6, c
assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens == c.usage.prompt_tokens + 24, c.usage

llm = LangChainOpenAI(base_url=api, api_key="unused", model="m", max_tokens=6, temperature=0, max_retries=0)
assert llm.invoke(france) == FRANCE_6
assert "".join(llm.stream(france)) == FRANCE_6
batch = llm.batch([france, count])
assert batch[0] == FRANCE_6 and batch[1] != FRANCE_6 and batch[1], batch
generated = llm.generate([france, count]).generations
assert [g[0].text for g in generated] == batch, generated

with tempfile.TemporaryDirectory() as home:
    with open(os.path.join(home, "extra-openai-models.yaml"), "w") as f:
        f.write(f"- model_id: cmpl-local\n  model_name: m\n  api_base: \"{api}\"\n  completion: true\n")
    env = dict(os.environ, LLM_USER_PATH=home)
    llm_cli = os.path.join(os.path.dirname(sys.executable), "llm")
    for extra in ([], ["--no-stream"]):
        out = subprocess.run([llm_cli, "-m", "cmpl-local", france, "-o", "max_tokens", "6", "-o", "temperature", "0",
                              "-o", "logprobs", "2", "-o", "stop", "zzz", *extra],
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout == FRANCE_6 + "\n", repr(out.stdout)
print("ok")
