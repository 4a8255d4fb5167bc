"""Makes the tests' stand-in guard model: a copy of a GGUF file with another
chat template in its metadata (`tokenizer.chat_template`), the weights
untouched. No real guard model (Llama Guard, ShieldGemma) can be fetched
here, so the tests give a model that is here a guard's template of their
own, which decides the verdict and has the model copy it out.
argv: SOURCE.gguf DEST.gguf TEMPLATE_FILE"""
import shutil, struct, sys

source, dest, template_file = sys.argv[1:4]
KEY = "tokenizer.chat_template"
with open(template_file, encoding="utf-8") as f:
    template = f.read().encode("utf-8")

SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def string_bytes(text):
    return struct.pack("<Q", len(text)) + text


with open(source, "rb") as f:
    def read(fmt):
        return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

    def skip_value(kind):
        if kind == 8:
            f.seek(read("Q"), 1)
        elif kind == 9:
            inner, count = read("I"), read("Q")
            if inner in SIZES:
                f.seek(SIZES[inner] * count, 1)
            else:
                for _ in range(count):
                    skip_value(inner)
        else:
            f.seek(SIZES[kind], 1)

    assert f.read(4) == b"GGUF", "not a GGUF file"
    version, n_tensors, n_kv = read("I"), read("Q"), read("Q")
    kvs, alignment = [], 32
    for _ in range(n_kv):
        start = f.tell()
        key = f.read(read("Q")).decode("utf-8")
        kind = read("I")
        if key == "general.alignment":
            alignment = read("I")
        else:
            skip_value(kind)
        end = f.tell()
        if key != KEY:
            f.seek(start)
            kvs.append(f.read(end - start))
    kvs.append(string_bytes(KEY.encode()) + struct.pack("<I", 8) + string_bytes(template))
    infos_start = f.tell()
    for _ in range(n_tensors):
        f.seek(read("Q"), 1)  # name
        dims = read("I")
        f.seek(8 * dims + 4 + 8, 1)  # dims, type, offset
    infos_end = f.tell()
    f.seek(infos_start)
    infos = f.read(infos_end - infos_start)
    data_start = -(-infos_end // alignment) * alignment

    with open(dest, "wb") as out:
        out.write(b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(kvs)))
        for kv in kvs:
            out.write(kv)
        out.write(infos)
        out.write(b"\0" * (-out.tell() % alignment))
        f.seek(data_start)
        shutil.copyfileobj(f, out, 1 << 20)
