#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into tests/fuzz/corpus/<target>/ from the
gallery, the backward test specs, the diagnostic tests' programs and hand-made files.
Run from anywhere: python3 tests/fuzz/make_seed_corpus.py (it replaces the seed_* files)."""
import glob
import json
import os
import random
import re
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CORPUS = os.path.join(HERE, "corpus")


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed_" + name), "wb") as f:
        f.write(data)


def clear(target):
    for p in glob.glob(os.path.join(CORPUS, target, "seed_*")):
        os.remove(p)


def spec_files():
    return sorted(glob.glob(os.path.join(ROOT, "examples", "gallery", "*.json")) +
                  glob.glob(os.path.join(ROOT, "tests", "data", "backward", "*.json")))


def diagnostic_programs():
    """(kind, text, buffers) of every case in tests/errors/diagnostic_codes_test.cpp."""
    src = open(os.path.join(ROOT, "tests", "errors", "diagnostic_codes_test.cpp")).read()
    out = []
    for m in re.finditer(r'\{DiagCode::\w+, "(\w+)", "((?:[^"\\]|\\.)*)", \{([^}]*)\}', src):
        text = bytes(m.group(2), "utf-8").decode("unicode_escape")
        out.append((m.group(1), text, re.findall(r'"([^"]*)"', m.group(3))))
    return out


def frontend():
    clear("frontend")
    for path in spec_files():
        spec = json.load(open(path))
        name = os.path.splitext(os.path.basename(path))[0]
        decls = "\n".join(spec.get("buffers", []) + spec.get("params", []))
        write("frontend", name, "%s\0%s\0%s" % (spec.get("score_mod", ""), spec.get("mask_mod", ""), decls))
    for i, (kind, text, buffers) in enumerate(diagnostic_programs()):
        if kind == "score":
            write("frontend", "diag%02d" % i, "%s\0\0%s" % (text, "\n".join(buffers)))
        elif kind == "mask":
            write("frontend", "diag%02d" % i, "\0%s\0%s" % (text, "\n".join(buffers)))
        elif kind in ("buffer", "param"):
            write("frontend", "diag%02d" % i, "\0q >= kv\0%s" % text)
    programs = [
        ("score + bias[h, q - kv + Skv - 1]", "let d = q - kv;\nd >= 0 && d < window"),
        ("cap * tanh(score / cap)", "doc[q] == doc[kv] and not (kv > q)"),
        ("where(q >= kv, score, -inf)", "kv < window || q >= kv"),
        ("score + rel[b, h, q, kv // 64] + rel[b][h][q][kv % 64]", ""),
        ("score * sigmoid(float(q - kv) / 8.0) + exp2(-abs(q - kv))", "(q ^ kv) & 1 == 0 ? true : false"),
        ("pow(abs(score), 0.5) * sign(score) + log1p(abs(bias[h, -1]))", "clamp(q - kv, -3, 3) != 0 | q == kv"),
        ("score + t[offset[q] % N] * u[h]", ""),
    ]
    extra = "t: f32[N]\noffset: i64[Sq]\nu: f16[H]\nflag: bool[Skv]\nsmall: u8[4]\np: float\nconst k: int = 4"
    for i, (s, m) in enumerate(programs):
        write("frontend", "program%d" % i, "%s\0%s\0%s" % (s, m, extra))


def spec_json():
    clear("spec_json")
    for path in spec_files():
        write("spec_json", os.path.basename(path), open(path, "rb").read())
    for i, (kind, text, buffers) in enumerate(diagnostic_programs()):
        spec = {"buffers": buffers}
        if kind == "json":
            write("spec_json", "diag%02d.json" % i, text)
            continue
        if kind == "buffer":
            spec["buffers"] = buffers + [text]
        elif kind == "param":
            spec["params"] = [text]
        else:
            spec[kind + "_mod"] = text
        write("spec_json", "diag%02d.json" % i, json.dumps(spec))
    write("spec_json", "shapes.json", json.dumps({"buffers": {"bias": "f32[H, L]"}, "grad": ["bias", 3], "dtype": "f16",
                                                  "head_dim": 96, "head_dim_v": 64, "gqa_group": 4, "name": "x"}))
    write("spec_json", "not_object.json", "[1, 2]")


def npy_bytes(descr, shape, payload, version=1, fortran=False):
    shape_text = "(" + "".join("%d," % d for d in shape) + ")" if len(shape) != 1 else "(%d,)" % shape[0]
    header = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, "True" if fortran else "False", shape_text)
    size_bytes = 2 if version == 1 else 4
    pad = (64 - (6 + 2 + size_bytes + len(header) + 1) % 64) % 64
    header = (header + " " * pad + "\n").encode()
    length = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header + payload


def npy():
    clear("npy")
    cases = [("f4", "<f4", [2, 3], 4), ("f2", "<f2", [4], 2), ("bf16", "<u2", [1, 2, 2], 2), ("v2", "<V2", [3], 2),
             ("i4", "<i4", [5], 4), ("i8", "<i8", [2, 2], 8), ("u1", "|u1", [7], 1), ("b1", "|b1", [3], 1),
             ("scalar", "<f4", [], 4), ("empty", "<f4", [0, 4], 4), ("bfloat16", "bfloat16", [2], 2)]
    for name, descr, shape, size in cases:
        n = 1
        for d in shape:
            n *= d
        write("npy", name + ".npy", npy_bytes(descr, shape, bytes((i * 7) & 0xff for i in range(n * size))))
    write("npy", "v2.npy", npy_bytes("<f4", [2], b"\0" * 8, version=2))
    write("npy", "v3.npy", npy_bytes("<i4", [1], b"\1\0\0\0", version=3))
    write("npy", "fortran.npy", npy_bytes("<f4", [2, 2], b"\0" * 16, fortran=True))
    write("npy", "big_endian.npy", npy_bytes(">f4", [1], b"\0" * 4))
    write("npy", "truncated.npy", npy_bytes("<f4", [4, 4], b"\0" * 10))


def cache_entry(key_text, json_blob, binary, schema=1, version=1):
    """An entry as runtime/disk_cache.cpp writes it, with a zero checksum (the fuzz input's flag 2
    recomputes it; flag 1 substitutes the requested key's text)."""
    key, blob = key_text.encode(), json_blob.encode()
    header = b"FLEXJITK" + struct.pack("<IIQQQ", version, schema, len(key), len(blob), len(binary))
    return header + key + blob + binary + b"\0" * 8


def disk_cache():
    clear("disk_cache")
    cubin = b"\x7fELF\x02\x01\x01" + bytes(range(64))
    blob = json.dumps({"entries": ["flexjit_forward", "flexjit_block_mask"],
                       "metadata": {"resources": {"flexjit_forward": {"registers": 128}}, "compile_seconds": 1.5}})
    write("disk_cache", "intact", b"\x03" + cache_entry("schema=1\nplaceholder=1\n", blob, cubin))
    write("disk_cache", "intact_empty_binary", b"\x03" + cache_entry("k\n", '{"entries": [], "metadata": {}}', b""))
    write("disk_cache", "bad_checksum", b"\x01" + cache_entry("k\n", blob, cubin))
    write("disk_cache", "other_key", b"\x02" + cache_entry("schema=1\nother=1\n", blob, cubin))
    write("disk_cache", "bad_json", b"\x03" + cache_entry("k\n", '{"entries": 3}', cubin))
    write("disk_cache", "other_schema", b"\x03" + cache_entry("k\n", blob, cubin, schema=9))
    write("disk_cache", "truncated", b"\x00" + cache_entry("k\n", blob, cubin)[:50])


def capi():
    """Scenario bytes for tests/fuzz/targets/capi.cpp: each seed picks the kernel, its head dim and
    small valid sizes (B 2, Hkv 2, H 2 Hkv, Sq 21, Skv 31, N 4), then the launch kind; the rest of
    the choices are random bytes."""
    clear("capi")
    rng = random.Random(27)
    for spec in range(6):
        for kind in range(5):
            head = bytes([spec, 0, 1, 0, 1, 0, 1, 0, 20, 0, 30, 0, 3, 0, kind])
            write("capi", "spec%d_kind%d" % (spec, kind), head + bytes(rng.randrange(256) for _ in range(96)))


if __name__ == "__main__":
    frontend()
    spec_json()
    npy()
    disk_cache()
    capi()
