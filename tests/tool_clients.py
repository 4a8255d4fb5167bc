"""Drives `cmpl --serve`'s chat endpoint with tools, through clients no one
here wrote: the OpenAI SDK (a call, plain and streamed; a second turn that
feeds the tool's answer back; `required` and a named tool; `none`),
LangChain's ChatOpenAI(...).bind_tools(...) in a tool loop, and `llm`'s
tools through an OpenAI-compatible model. argv: ROOT_URL. The model is the
tool model (Qwen2.5-Coder 0.5B Instruct, whose template reads `tools`).
Prints "ok" or fails loudly."""
import json, os, subprocess, sys, tempfile
from openai import OpenAI

root = sys.argv[1]
api = root + "/v1"
client = OpenAI(base_url=api, api_key="unused", max_retries=0)
weather = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
clock = {"type": "function", "function": {
    "name": "get_time", "description": "The time now in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ask = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_call(call, name="get_weather"):
    assert call.type == "function" and call.id.startswith("call_"), call
    assert call.function.name == name, call
    args = json.loads(call.function.arguments)
    assert args["city"] == "Paris", args
    if "unit" in args:
        assert args["unit"] in ("celsius", "fahrenheit"), args
    return args


# A call: content null, the call's arguments a JSON string, finish tool_calls.
c = client.chat.completions.create(model="m", messages=ask, tools=[weather], temperature=0, max_tokens=64)
m = c.choices[0].message
assert c.choices[0].finish_reason == "tool_calls", c
assert m.content is None and len(m.tool_calls) == 1, m
first = check_call(m.tool_calls[0])

# Streamed: the call's arguments come in fragments as they are written,
# and the SDK's stream helper joins them into the same call.
fragments = 0
with client.chat.completions.stream(model="m", messages=ask, tools=[weather], temperature=0,
                                    max_tokens=64) as stream:
    for event in stream:
        if event.type == "chunk" and event.chunk.choices:
            for call in event.chunk.choices[0].delta.tool_calls or []:
                fragments += bool(call.function and call.function.arguments)
    final = stream.get_final_completion()
assert fragments > 1, f"the arguments came in {fragments} fragment(s)"
streamed = final.choices[0].message.tool_calls
assert final.choices[0].finish_reason == "tool_calls", final
assert len(streamed) == 1 and json.loads(streamed[0].function.arguments) == first, streamed

# The second turn: the call and the tool's answer go back, and the model,
# asked for words (`none`: this small model would call again), answers from it.
turn = ask + [
    {"role": "assistant", "content": None, "tool_calls": [m.tool_calls[0].model_dump()]},
    {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
]
c = client.chat.completions.create(model="m", messages=turn, tools=[weather], temperature=0, max_tokens=64,
                                   tool_choice="none")
said = c.choices[0].message
assert c.choices[0].finish_reason == "stop" and said.tool_calls is None, c
assert "21" in said.content, said.content

# `required`, and a named tool among two: always that call.
c = client.chat.completions.create(model="m", messages=ask, tools=[clock, weather], temperature=0,
                                   max_tokens=64, tool_choice="required")
assert c.choices[0].finish_reason == "tool_calls", c
named = {"type": "function", "function": {"name": "get_time"}}
c = client.chat.completions.create(model="m", messages=ask, tools=[clock, weather], temperature=0,
                                   max_tokens=64, tool_choice=named)
check_call(c.choices[0].message.tool_calls[0], "get_time")
# `none`: words, whatever they say.
c = client.chat.completions.create(model="m", messages=ask, tools=[weather], temperature=0,
                                   max_tokens=64, tool_choice="none")
assert c.choices[0].finish_reason == "stop" and c.choices[0].message.tool_calls is None, c
assert c.choices[0].message.content, c

# A name not among the tools: a 400 that names the field.
try:
    client.chat.completions.create(model="m", messages=ask, tools=[weather],
                                   tool_choice={"type": "function", "function": {"name": "get_stock"}})
    raise AssertionError("an unknown tool_choice was answered")
except Exception as e:
    assert getattr(e, "status_code", None) == 400 and "tool_choice" in str(e), e

# LangChain: bind_tools, the call run, and its result answered from.
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city"""
    return json.dumps({"city": city, "temperature": 21, "sky": "clear"})


chat = ChatOpenAI(base_url=api, api_key="unused", model="m", temperature=0, max_tokens=64, max_retries=0)
bound = chat.bind_tools([get_weather])
# The loop an agent runs: invoke with the tools bound, run each call, give
# its result back, until the model answers in words (bounded). After a
# result the tools stay bound and `none` asks for words (this small model
# would call again under `auto`).
history = [HumanMessage("What is the weather in Paris?")]
answered = bound.bind(tool_choice="none")
for turn in range(3):
    reply = (bound if turn == 0 else answered).invoke(history)
    history.append(reply)
    if not reply.tool_calls:
        break
    for call in reply.tool_calls:
        assert call["name"] == "get_weather" and call["args"]["city"] == "Paris", reply.tool_calls
        history.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
assert turn == 1 and len(history) == 4, history
assert not history[-1].tool_calls and "21" in history[-1].content, history[-1]

# `llm`: an OpenAI-compatible model with a Python function as its tool.
with tempfile.TemporaryDirectory() as home:
    with open(os.path.join(home, "extra-openai-models.yaml"), "w") as f:
        f.write(f"- model_id: cmpl\n  model_name: m\n  api_base: {api}\n  supports_tools: true\n")
    env = dict(os.environ, LLM_USER_PATH=home, OPENAI_API_KEY="unused")
    code = ("def get_weather(city: str) -> str:\n"
            "    \"Get the current weather in a city\"\n"
            "    return '{\"temperature\": 21, \"sky\": \"clear\"}'\n")
    out = subprocess.run([sys.executable, "-m", "llm", "-m", "cmpl", "--functions", code, "--td",
                          "-o", "temperature", "0", "-o", "max_tokens", "64", "--no-stream",
                          "--chain-limit", "2", "What is the weather in Paris?"],
                         env=env, capture_output=True, text=True, timeout=120)
    # llm read the call, ran the function and sent its answer back (--td
    # shows both); what the model does next is this small model's own: under
    # `auto` it calls again (each answer's whole calls are calls, even where
    # the length cut the answer), until llm's chain limit stops the loop.
    assert out.returncode == 0 or "Chain limit of 2 exceeded" in out.stderr, out.stderr
    assert "Tool call: get_weather({'city': 'Paris'" in out.stderr, (out.stdout, out.stderr)
    assert '"temperature": 21' in out.stderr, (out.stdout, out.stderr)

print("ok")
