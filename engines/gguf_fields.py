"""A GGUF's key/values copied into a ``gguf.GGUFWriter`` as the ``gguf`` package reads them:
the dequantized float32 GGUF onnxruntime-genai's builder reads and the rewritten GGUFs of
planted bugs and fresh quantizations keep every other field of their source this way."""
from __future__ import annotations


def copy_gguf_fields(reader, writer, skip: set[str]) -> None:
    """Every field of ``reader`` but the ``GGUF.*`` header fields and those in ``skip``."""
    import gguf

    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name in skip:
            continue
        kind = f.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == gguf.GGUFValueType.STRING:
                value = [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
            else:
                value = [f.parts[i].tolist()[0] for i in f.data]
            writer.add_key_value(name, value, kind, sub_type=sub)
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_key_value(name, bytes(f.parts[f.data[0]]).decode("utf-8"), kind)
        else:
            writer.add_key_value(name, f.parts[f.data[0]].tolist()[0], kind)


__all__ = ["copy_gguf_fields"]
