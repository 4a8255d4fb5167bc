"""The reference for cmpl's chat templates: renders a conversation as
Hugging Face's `transformers` renders it (`apply_chat_template`: jinja2's
sandbox with trim_blocks and lstrip_blocks, loop controls, raise_exception,
strftime_now, its own tojson), with the template and the BOS and EOS texts
read from the GGUF file itself (or the template from a file).
argv: MODEL.gguf TEMPLATE_FILE|- MESSAGES_JSON [TOOLS_JSON]. Prints the text,
nothing else. With @LIST for the template (a file holding a JSON list of
template files), renders each (the model read once) and prints a JSON list
of {"text": ...} or {"error": ...}, in order."""
import json, struct, sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

model, template_file, messages = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
# Tools as transformers passes them: the variable is left out when none.
extra = {"tools": json.loads(sys.argv[4])} if len(sys.argv) > 4 else {}


def gguf_metadata(path):
    """The metadata keys of a GGUF file; the token list as strings."""
    with open(path, "rb") as f:
        def read(fmt):
            size = struct.calcsize(fmt)
            return struct.unpack("<" + fmt, f.read(size))[0]

        def string():
            return f.read(read("Q")).decode("utf-8", errors="replace")

        scalars = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

        def value(kind):
            if kind == 8:
                return string()
            if kind == 9:
                inner, count = read("I"), read("Q")
                return [value(inner) for _ in range(count)]
            return read(scalars[kind])

        assert f.read(4) == b"GGUF", "not a GGUF file"
        read("I")  # version
        read("Q")  # tensors
        meta = {}
        for _ in range(read("Q")):
            key = string()
            meta[key] = value(read("I"))
        return meta


meta = gguf_metadata(model)
tokens = meta.get("tokenizer.ggml.tokens", [])
def token(key):
    i = meta.get(key)
    return tokens[i] if i is not None and 0 <= i < len(tokens) else ""


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render(source):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source).render(
        messages=messages,
        add_generation_prompt=True,
        bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"),
        **extra,
    )


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


if template_file.startswith("@"):
    out = []
    for path in json.loads(read(template_file[1:])):
        try:
            out.append({"text": render(read(path))})
        except Exception as e:  # noqa: BLE001 - jinja2's failure, reported per template
            out.append({"error": f"{type(e).__name__}: {e}"})
    sys.stdout.write(json.dumps(out))
else:
    source = meta["tokenizer.chat_template"] if template_file == "-" else read(template_file)
    sys.stdout.write(render(source))
