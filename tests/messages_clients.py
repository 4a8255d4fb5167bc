"""Anthropic's own SDK (pinned in scripts/test) against `cmpl --serve`'s
Messages API: a message whole and streamed, a tool loop, a thought, the
token count, and a bad body as the SDK's own error. Prints "ok"."""
import sys

import anthropic

client = anthropic.Anthropic(base_url=sys.argv[1], api_key="unused", max_retries=0)
question = [{"role": "user", "content": "What is the capital of France?"}]
# Today's SDK sends no sampling fields; a script that wants greedy answers
# (the same whole and streamed) sends `temperature` as an extra field.
greedy = {"extra_body": {"temperature": 0}}
ask = dict(model="m", max_tokens=32, system="Answer in one short sentence.", messages=question,
           **greedy)

whole = client.messages.create(**ask)
assert whole.type == "message" and whole.role == "assistant", whole
assert whole.content[-1].type == "text" and whole.content[-1].text, whole
assert whole.stop_reason in ("end_turn", "max_tokens"), whole
with client.messages.stream(**ask) as stream:
    text = "".join(stream.text_stream)
    final = stream.get_final_message()
assert text == whole.content[-1].text, (text, whole)
assert final.content[-1].text == text and final.stop_reason == whole.stop_reason, final
assert final.usage.output_tokens == whole.usage.output_tokens, (final.usage, whole.usage)
counted = client.messages.count_tokens(model="m", system=ask["system"], messages=question)
assert counted.input_tokens == whole.usage.input_tokens, (counted, whole.usage)

# The loop an agent runs: a call, its result given back, an answer in words.
tools = [{"name": "get_weather", "description": "Get the current weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]
turns = [{"role": "user", "content": "What is the weather in Paris?"}]
called = client.messages.create(model="m", max_tokens=64, tools=tools,
                                tool_choice={"type": "any"}, messages=turns, **greedy)
assert called.stop_reason == "tool_use", called
call = next(b for b in called.content if b.type == "tool_use")
assert call.name == "get_weather" and call.input["city"] == "Paris", call
turns += [{"role": "assistant", "content": called.content},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                        "content": '{"temperature": 21, "sky": "clear"}'}]}]
answered = client.messages.create(model="m", max_tokens=48, tools=tools,
                                  tool_choice={"type": "none"}, messages=turns, **greedy)
assert answered.content[-1].type == "text" and answered.stop_reason != "tool_use", answered

# A thought of four tokens, whole and streamed: the same blocks.
think = dict(model="m", max_tokens=48, thinking={"type": "enabled", "budget_tokens": 4},
             messages=[{"role": "user", "content": "What is 2+2?"}], **greedy)
thought = client.messages.create(**think)
assert [b.type for b in thought.content] == ["thinking", "text"], thought
assert thought.content[0].thinking == "2 + 2", thought
with client.messages.stream(**think) as stream:
    final = stream.get_final_message()
assert final.content[0].thinking == "2 + 2" and final.content[1].text == thought.content[1].text, final

try:
    client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
    raise AssertionError("an image was taken")
except anthropic.BadRequestError as e:
    assert e.status_code == 400 and "image" in str(e), e

print("ok")
