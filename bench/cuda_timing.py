"""CUDA-event timing shared by the Python end-to-end benchmarks (sam_encoder.py, decoder_block.py)."""
import statistics

import torch


def median_ms(step, iters, warmup=3):
    """The median over `iters` runs of `step`'s GPU time in milliseconds, after `warmup` runs."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
