"""What the GPU benchmark scripts share: their command line, do_bench's median, FlashAttention-4's entry points
(installed into a site directory by the FlashAttention-4 preparation script of the GPU machine) and one-line error texts for table cells."""
import argparse
import datetime
import os
import site

import triton.testing as tt


def parse_args(description, baselines=True, flexjit_only=True, extra=None):
    """--flexjit and --out; with baselines, --only and FlashAttention-4's --site (added to sys.path when it exists);
    --flexjit-only where the script can skip its baselines. extra(ap) adds a script's own options."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--flexjit", required=True, help="the flexjit binary")
    ap.add_argument("--out", required=True, help="directory for bench.json and results_table.md")
    if baselines:
        ap.add_argument("--only", nargs="*", default=None, help="run only these cases")
        ap.add_argument("--site", default="/tmp/site", help="site directory of flash-attn-4 (prepare.sh)")
    if flexjit_only:
        ap.add_argument("--flexjit-only", action="store_true", help="time flexjit alone (no baselines)")
    if extra:
        extra(ap)
    args = ap.parse_args()
    if baselines and os.path.isdir(args.site):
        site.addsitedir(args.site)
    return args


def bench(fn, warmup=25, rep=100):
    """Median milliseconds of fn, as triton's do_bench times it (L2 flushed before each run)."""
    return tt.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def error_text(e, limit=200):
    """The first line of an exception's message (or its type), short enough for a table cell."""
    text = str(e).strip()
    return text.splitlines()[0][:limit] if text else type(e).__name__


def fa4_function(name="flash_attn_func"):
    """FlashAttention-4's `name` from flash_attn.cute, or why it cannot be imported (a string)."""
    try:
        import flash_attn.cute as cute  # noqa: PLC0415
        return getattr(cute, name)
    except Exception as e:  # noqa: BLE001
        return error_text(e)


def add_flexjit(row, result, flops, baselines):
    """flexjit's result (the `flexjit bench --json` object, or {"error": ...}) into a case's row, and TFLOP/s for
    every column the row timed."""
    row["flexjit"] = result
    if "ms" in result:
        row["flexjit_ms"] = result["ms"]
    for key in ("flexjit",) + tuple(baselines):
        if key + "_ms" in row:
            row[key + "_tflops"] = flops / row[key + "_ms"] / 1e9


def table_heading(title):
    """A results table's heading line: what, today's date, the GPU, flexjit's commit (FLEXJIT_COMMIT) and torch."""
    import torch  # noqa: PLC0415

    commit = os.environ.get("FLEXJIT_COMMIT", "unknown")
    return f"\n### {title}, {datetime.date.today()}, {torch.cuda.get_device_name()}, commit {commit}, torch {torch.__version__}\n"
