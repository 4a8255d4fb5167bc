"""OpenAI's own SDK (pinned in scripts/test) against `cmpl --serve`'s
Responses API: a response whole and streamed, and a function-calling loop.
Prints "ok"."""
import json
import sys

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0)
ask = dict(model="m", max_output_tokens=32, temperature=0,
           instructions="Answer in one short sentence.", input="What is the capital of France?")
whole = client.responses.create(**ask)
assert whole.status == "completed" and whole.output_text, whole
with client.responses.stream(**ask) as stream:
    deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    final = stream.get_final_response()
assert deltas == whole.output_text == final.output_text, (deltas, whole, final)
assert final.usage.output_tokens == whole.usage.output_tokens, (final.usage, whole.usage)

tools = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}]
items = [{"role": "user", "content": "What is the weather in Paris?"}]
called = client.responses.create(model="m", max_output_tokens=64, temperature=0, tools=tools,
                                 tool_choice="required", input=items)
call = next(i for i in called.output if i.type == "function_call")
assert call.name == "get_weather" and json.loads(call.arguments)["city"] == "Paris", call
items += [call, {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21, "sky": "clear"}'}]
answered = client.responses.create(model="m", max_output_tokens=48, temperature=0, tools=tools,
                                   tool_choice="none", input=items)
assert answered.output_text, answered

print("ok")
