"""The terminal side of `pretrain bench`: the result table."""

from __future__ import annotations

from rich.table import Table

from .timing import NOISY_SPREAD_PCT


def table(profile: dict) -> Table:
    """Best and median TFLOP/s per dtype, bandwidths, and the block's tokens/s and MFU."""
    threads = (
        f", {profile['threads']} CPU thread{'s' if profile['threads'] != 1 else ''} ({profile['threads_chosen_as']})"
        if profile["threads"]
        else ""
    )
    t = Table(
        title=f"{profile['device']} ({profile['device_type']}, torch {profile['torch']}): median of "
        f"{profile['rounds']} rounds{threads}",
        caption="spread: (max - min) / median of the rounds",
        caption_justify="left",
    )
    noise = profile["spread_pct"]
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("detail")
    for dtype, best in profile["peak_tflops"].items():
        shapes = [s for s in profile["shapes"] if s["dtype"] == dtype]
        top = max(shapes, key=lambda s: s["tflops"]) if shapes else None
        detail = (
            f"median {profile['median_tflops'][dtype]:.4g} over {len(shapes)} shape"
            f"{'s' if len(shapes) > 1 else ''}; best at {top['m']}x{top['n']}x{top['k']}"
            if top
            else "same as fp32 (no TF32 on a CPU)"
        )
        t.add_row(f"{dtype} matmul", f"{best:.4g} TFLOP/s", detail + _spread(noise["peak_tflops"].get(dtype)))
    for dtype, reason in profile["skipped"].items():
        t.add_row(f"{dtype} matmul", "skipped", reason)
    t.add_row(
        "device memory copy",
        f"{profile['memory_bandwidth_gbps']:.4g} GB/s",
        "read + write" + _spread(noise["memory_bandwidth_gbps"]),
    )
    h2d = profile["host_to_device_gbps"]
    t.add_row(
        "host to device",
        f"{h2d:.4g} GB/s" if h2d else "n/a",
        "pinned memory" + _spread(noise["host_to_device_gbps"]) if h2d else "CPU: no transfer",
    )
    b = profile["block"]
    c = b["config"]
    shape = (
        f"H={c['model']['hidden_size']} H'={c['model']['intermediate_size']}, {c['micro_batch_size']} x "
        f"{c['seq_len']} tokens, {c['precision']}"
    )
    t.add_row("block fwd+bwd", f"{b['tokens_per_s']:,.0f} tokens/s", shape + _spread(noise["block_tokens_per_s"]))
    mfu = f"{b['mfu']:.1%}" if b["mfu"] is not None else "n/a"
    peak = f"{b['peak_tflops']:.4g}" if b["peak_tflops"] else "n/a"
    t.add_row("block MFU", mfu, f"{b['achieved_tflops']:.4g} TFLOP/s / peak {peak} ({b['peak_source']})")
    return t


def _spread(pct: float | None) -> str:
    """'; spread 4%' after a figure's detail, '!' above NOISY_SPREAD_PCT; nothing for one round."""
    if pct is None:
        return ""
    return f"; spread {pct:.0f}%" + (" !" if pct > NOISY_SPREAD_PCT else "")
