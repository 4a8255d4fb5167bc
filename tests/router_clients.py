"""The OpenAI SDK (pinned in scripts/test) against a `cmpl --serve` of
several models: `models.list()` names each, a completion from the base
model, and a chat with each instruct model, each answering as itself.
Prints "ok"."""
import sys

import openai

url, base, *chat_models = sys.argv[1:]
client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
listed = [m.id for m in client.models.list()]
assert listed == [base, *chat_models], listed

done = client.completions.create(model=base, prompt="The capital of France is", max_tokens=8,
                                 temperature=0)
assert done.model == base and done.choices[0].text, done
answers = {}
for model in chat_models:
    chat = client.chat.completions.create(
        model=model, max_tokens=16, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert chat.model == model, chat
    assert chat.choices[0].message.content, chat
    answers[model] = chat.choices[0].message.content
# Two models: two different answers (each its own weights and template).
assert len(set(answers.values())) == len(chat_models), answers
try:
    client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    raise AssertionError("an unknown model was answered")
except openai.NotFoundError as e:
    assert "this server serves" in e.body["message"], e.body
print("ok")
