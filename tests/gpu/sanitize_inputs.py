"""Writes small random inputs for the compute-sanitizer runs of tools/gpu_check.sh."""
import os
import sys

import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(0)


def bf16(a):
    # Round to nearest even, stored as uint16 (flexjit's .npy form of bf16).
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


B, H, S, D = 1, 2, 300, 64
for name in "qkv":
    np.save(f"{out}/{name}.npy", bf16(rng.standard_normal((B, H, S, D))))
np.save(f"{out}/doc.npy", np.sort(rng.integers(0, 5, S)).astype(np.int32))
np.save(f"{out}/rel.npy", bf16(rng.standard_normal((B, H, S, 64))))
np.save(f"{out}/bias.npy", rng.standard_normal((H, 2 * S - 1)).astype(np.float32))  # relative_bias: f32[H, 2 Skv - 1]
np.save(f"{out}/slope.npy", rng.uniform(0.01, 0.5, H).astype(np.float32))  # alibi_causal: f32[H]
