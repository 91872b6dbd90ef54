"""safetensors read/write with torch alone (no safetensors package needed): 8-byte little-endian header size,
JSON header {name: {dtype, shape, data_offsets}}, then the tensors' bytes in header order."""
import json
import struct

import torch

_DT = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16", torch.uint8: "U8",
       torch.int32: "I32", torch.int64: "I64", torch.float64: "F64"}
_TD = {v: k for k, v in _DT.items()}
_SIZE = {"BF16": 2, "F32": 4, "F16": 2, "U8": 1, "I32": 4, "I64": 8, "F64": 8}


def _bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def st_save(tensors, path, metadata=None):
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        b = _bytes(t)
        header[name] = {"dtype": _DT[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def st_load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dt = info["dtype"]
        raw = bytearray(data[a:b])
        if dt in ("BF16", "F16"):
            t = torch.frombuffer(raw, dtype=torch.int16).view(_TD[dt]) if b > a else torch.empty(0, dtype=_TD[dt])
        else:
            t = torch.frombuffer(raw, dtype=_TD[dt]) if b > a else torch.empty(0, dtype=_TD[dt])
        out[name] = t.reshape(info["shape"]).clone()
    return out
