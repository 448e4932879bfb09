"""Test inputs written with the Python standard library only (no numpy):
LCG-filled .npy files and .safetensors checkpoints, the same bytes for the
same arguments on every machine.

lcg(seed, count, spread): value i is ((state_i >> 40) / 2**24 - 0.5) * spread,
state_i the i-th step of Knuth's MMIX LCG from seed.
"""

import json
import struct


def lcg(seed, count, spread):
    state, vals = seed, []
    for _ in range(count):
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        vals.append(((state >> 40) / 2**24 - 0.5) * spread)
    return vals


def write_npy(path, shape, vals):
    """A C-order '<f4' .npy (version 1.0) of `shape` holding vals."""
    dims = ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "")
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % dims
    hdr += " " * (64 - (10 + len(hdr) + 1) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        f.write(struct.pack("<%df" % len(vals), *vals))


def bf16_bytes(vals):
    """vals rounded to bf16 (nearest even), little-endian."""
    out = bytearray()
    for v in vals:
        b = struct.unpack("<I", struct.pack("<f", v))[0]
        b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        out += struct.pack("<H", b)
    return bytes(out)


def tensor_bytes(dtype, vals):
    if dtype == "F32":
        return struct.pack("<%df" % len(vals), *vals)
    if dtype == "BF16":
        return bf16_bytes(vals)
    raise ValueError("dtype " + dtype)


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype, shape, vals)}; written in name order."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dtype, shape, vals = tensors[name]
        blob = tensor_bytes(dtype, vals)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(blob)]}
        blobs.append(blob)
        off += len(blob)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)


def wan_attention_tensors(hidden, block=0, dtype="F32", seed=7, naming="original"):
    """One Wan2.2 self-attention block's tensors {name: (dtype, shape, vals)}
    with LCG values: weights ~ U(-0.5, 0.5) * 2 / sqrt(hidden), biases and
    gammas near 0 and 1. naming: 'original' (blocks.N.self_attn.q ...) or
    'diffusers' (blocks.N.attn1.to_q ...): the same tensors under either."""
    if naming == "original":
        lin = {"q": "self_attn.q", "k": "self_attn.k", "v": "self_attn.v", "o": "self_attn.o"}
        norm = {"q": "self_attn.norm_q", "k": "self_attn.norm_k"}
    else:
        lin = {"q": "attn1.to_q", "k": "attn1.to_k", "v": "attn1.to_v", "o": "attn1.to_out.0"}
        norm = {"q": "attn1.norm_q", "k": "attn1.norm_k"}
    p = "blocks.%d." % block
    out, s = {}, seed
    ws = 2.0 / hidden**0.5
    for m in "qkvo":
        out[p + lin[m] + ".weight"] = (dtype, (hidden, hidden), lcg(s, hidden * hidden, ws))
        out[p + lin[m] + ".bias"] = (dtype, (hidden,), lcg(s + 1, hidden, 0.2))
        s += 2
    for m in "qk":
        out[p + norm[m] + ".weight"] = (dtype, (hidden,), [1.0 + v for v in lcg(s, hidden, 0.4)])
        s += 1
    return out


def write_sharded(folder, tensors, shard_of, stem="diffusion_pytorch_model", missing=()):
    """A sharded checkpoint in folder: STEM-0000K-of-0000N.safetensors files
    and STEM.safetensors.index.json whose weight_map names each tensor's
    shard. shard_of(name) -> shard number (1-based); shards numbered in
    `missing` are listed in the index but not written. Returns the index
    path."""
    import os

    groups = {}
    for name in tensors:
        groups.setdefault(shard_of(name), {})[name] = tensors[name]
    n = max(groups)
    files = {k: "%s-%05d-of-%05d.safetensors" % (stem, k, n) for k in groups}
    for k, group in groups.items():
        if k not in missing:
            write_safetensors(os.path.join(folder, files[k]), group)
    index = {"metadata": {"total_size": 0}, "weight_map": {name: files[shard_of(name)] for name in sorted(tensors)}}
    path = os.path.join(folder, stem + ".safetensors.index.json")
    with open(path, "w") as f:
        json.dump(index, f, indent=2)
    return path
