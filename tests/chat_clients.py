"""Drives `cmpl --serve`'s chat endpoint with clients no one here wrote: the
OpenAI SDK's chat.completions (plain, streamed, logprobs, a json_schema
response_format, tools refused by a template that ignores them), LangChain's ChatOpenAI, and the `llm` tool
with an OpenAI-compatible chat model. argv: ROOT_URL ANSWER, the command
line's greedy --chat answer to the question (64 tokens), which the server
must give exactly. Prints "ok" or fails loudly."""
import json, os, subprocess, sys, tempfile
import openai
from openai import OpenAI
from langchain_openai import ChatOpenAI

root, ANSWER = sys.argv[1:3]
api = root + "/v1"
question = "Name the capital city of France."
messages = [{"role": "user", "content": question}]

client = OpenAI(base_url=api, api_key="unused", max_retries=0)
c = client.chat.completions.create(model="m", messages=messages, max_tokens=64, temperature=0)
assert c.object == "chat.completion", c
assert c.choices[0].message.role == "assistant", c
assert c.choices[0].message.content == ANSWER, (c.choices[0].message.content, ANSWER)
assert c.choices[0].finish_reason == "stop", c
assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens, c.usage

# A list of text parts is the same message.
parts = [{"role": "user", "content": [{"type": "text", "text": question}]}]
c = client.chat.completions.create(model="m", messages=parts, max_tokens=64, temperature=0)
assert c.choices[0].message.content == ANSWER, c

# Streamed: the deltas join to the same text, the role first, usage last.
text, roles, usage, finish = "", [], None, None
for chunk in client.chat.completions.create(model="m", messages=messages, max_tokens=64, temperature=0,
                                            stream=True, stream_options={"include_usage": True}):
    assert chunk.object == "chat.completion.chunk", chunk
    usage = chunk.usage or usage
    for choice in chunk.choices:
        roles.append(choice.delta.role)
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
assert text == ANSWER, (text, ANSWER)
assert roles[0] == "assistant" and all(r is None for r in roles[1:]), roles
assert finish == "stop" and usage is not None and usage.completion_tokens > 0, (finish, usage)

# Logprobs in the chat endpoint's shape.
c = client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0,
                                   logprobs=True, top_logprobs=2)
content = c.choices[0].logprobs.content
assert len(content) == c.usage.completion_tokens, content
for t in content:
    assert t.logprob <= 0 and len(t.top_logprobs) == 2, t
    assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob, t
    assert bytes(t.bytes).decode("utf-8", "replace") == t.token, t
assert "".join(t.token for t in content).startswith(ANSWER[:3]), content

# Structured output through response_format.
schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
          "additionalProperties": False}
c = client.chat.completions.create(
    model="m", messages=[{"role": "user", "content": question + " Answer in JSON."}], max_tokens=64,
    temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
answer = json.loads(c.choices[0].message.content)
assert set(answer) == {"city"} and isinstance(answer["city"], str), answer

# Tools are refused by name where the template ignores them (SmolLM2's does);
# so is a malformed conversation.
for bad, field in (({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
                   ({"messages": [{"role": "user"}]}, "messages")):
    try:
        client.chat.completions.create(**{"model": "m", "messages": messages, **bad})
        raise AssertionError(f"{field} was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and e.body["param"] == field, e.body

chat = ChatOpenAI(base_url=api, api_key="unused", model="m", max_tokens=64, temperature=0, max_retries=0)
assert chat.invoke(question).content == ANSWER
assert "".join(chunk.content for chunk in chat.stream(question)) == ANSWER

with tempfile.TemporaryDirectory() as home:
    with open(os.path.join(home, "extra-openai-models.yaml"), "w") as f:
        f.write(f"- model_id: cmpl-chat\n  model_name: m\n  api_base: \"{api}\"\n")
    env = dict(os.environ, LLM_USER_PATH=home)
    llm_cli = os.path.join(os.path.dirname(sys.executable), "llm")
    for extra in ([], ["--no-stream"]):
        out = subprocess.run([llm_cli, "-m", "cmpl-chat", question, "-o", "max_tokens", "64",
                              "-o", "temperature", "0", *extra],
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout == ANSWER + "\n", (out.stdout, ANSWER)
print("ok")
