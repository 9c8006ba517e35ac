"""Budget mode: what a budget of GPU time buys (`budget.gpu_hours`, `budget.days`, or `budget.cost`).

Compute: C = GPU-seconds x peak FLOP/s x hardware.mfu (GPU-seconds = gpu_hours x 3,600, days x 86,400 x
parallel.gpus, or cost / hardware.price_per_gpu_hour x 3,600).
Compute-optimal size: Hoffmann et al. 2022 ("Training Compute-Optimal Large Language Models"), approaches 1
and 2 (their table 2: N_opt ~ C^a with a = 0.50 and 0.49, D_opt ~ C^b with b = 0.50 and 0.51), taken as
a = b = 0.5 with their ~20 tokens per parameter (table 3) and C = 6 N D:
    N_opt = sqrt(C / 120),  D_opt = 20 N_opt.
A shape near N_opt by the conventions of the LLaMA family (Touvron et al. 2023; LLaMA-3 for the key/value
heads), vocabulary and context kept from the config:
    head_dim 128, heads = H / 128, H a multiple of 128; about 128 of width per layer (LLaMA-7B 4096 / 32,
    13B 5120 / 40) for the width, then the layer count that lands nearest N_opt;
    intermediate = 8/3 H rounded up to a multiple of 256 (LLaMA's multiple_of: 4096 -> 11,008);
    8 key/value heads (grouped-query attention, LLaMA-2 70B and LLaMA-3), or 4 where 8 does not divide the
    heads (H a multiple of 512 from 1,024 on), one per head below 8 heads; untied embeddings, SwiGLU, RMSNorm.
The shape is trained on D = C / (6 N) tokens, its own share of the compute. Whether it fits on the GPUs is the
ordinary plan's answer; when it does not, the cheapest fix on the same GPUs from pretrain.plan.fit_fixes
(recomputation, micro-batch, ZeRO, tensor parallelism) is applied.
Inference-aware row: half the parameters on twice the tokens (80 tokens per parameter, near LLaMA-13B's 1T /
13B = 77), cheaper to serve. Each row's predicted loss comes from Hoffmann et al.'s approach 3 parametric fit
    L(N, D) = E + A / N^alpha + B / D^beta,  E = 1.69, A = 406.4, B = 410.7, alpha = 0.34, beta = 0.28,
and its loss penalty is measured from that fit's own optimum for C (their equation 4), which lies at fewer
parameters than approaches 1-2 give: under it, the smaller row can cost next to nothing.

Precedence: the budget chooses the model only when none is given. With model.preset, model.hf_config or a shape
key away from its default (CHOSEN_KEYS), the model stays and the budget buys its training tokens, by the plan's
own time model (GPU-hours per token from pretrain.plan.budget.wall_clock). A length given beside a budget
(train.tokens, max_steps, examples) is refused either way: the budget fixes the tokens itself.
"""

from __future__ import annotations

import math

from ..config import Config, replaced, resolve
from ..config.checks import LARGEST
from ..errors import ConfigError
from ..units import GiB
from .budget import CHINCHILLA_TOKENS_PER_PARAM, storage_bytes, training_length, wall_clock
from .explain import Explain
from .flops import basis, flops
from .hardware import peak_tflops
from .params import count_params

HEAD_DIM = 128
WIDTH_PER_LAYER = 128  # LLaMA-7B: 4096 / 32 layers; 13B: 5120 / 40
MULTIPLE_OF = 256  # LLaMA's intermediate-size rounding
GQA_KV_HEADS = 8
APPROACH_3 = dict(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)  # Hoffmann et al. 2022, equation 10
INFERENCE_AWARE_SHRINK = 2  # half the parameters, twice the tokens
NO_BUDGET = {"budget.gpu_hours": None, "budget.days": None, "budget.cost": None}  # the chosen config plans plainly
# The widths llama_shape chooses from: multiples of 128 (of 512 from 1,024 on: heads divisible by 4, for grouped
# key/value heads and tensor parallelism).
WIDTHS = [*range(HEAD_DIM, 1024, HEAD_DIM), *range(1024, 64 * 1024 + 1, 512)]
# The model keys llama_shape chooses (it keeps the vocabulary and the context): one of them away from its
# default, or a preset or Hugging Face config, is a model the user gave, which a budget does not replace.
CHOSEN_KEYS = ("family", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
               "tie_embeddings")
DEFAULT_MODEL = resolve(Config()).model  # as a loaded config holds it (num_kv_heads, head_dim filled in)
LENGTH_KEYS = ("tokens", "max_steps", "examples")  # train.*: each fixes the tokens a budget would set


def budget_requested(cfg) -> bool:
    b = cfg.budget
    return any(v is not None for v in (b.gpu_hours, b.days, b.cost))


def budget_key(cfg) -> str:
    return next(f"budget.{k}" for k in ("gpu_hours", "days", "cost") if getattr(cfg.budget, k) is not None)


def model_given(cfg) -> str | None:
    """The `key=value` that fixes the model (model.preset, model.hf_config, or the first of CHOSEN_KEYS away
    from its default); None when budget mode is to choose it. A shape key given at its default value cannot
    be told apart from one left out: it counts as not given."""
    m = cfg.model
    if m.preset or m.hf_config:
        return f"model.preset={m.preset}" if m.preset else f"model.hf_config={m.hf_config}"
    key = next((k for k in CHOSEN_KEYS if getattr(m, k) != getattr(DEFAULT_MODEL, k)), None)
    return f"model.{key}={getattr(m, key)}" if key else None


def chinchilla_loss(n: float, d: float) -> float:
    k = APPROACH_3
    return k["E"] + k["A"] / n ** k["alpha"] + k["B"] / d ** k["beta"]


def approach_3_optimum(compute: float) -> float:
    """The parameters minimising L(N, C / 6N): N = G (C/6)^(beta / (alpha + beta)), G = (alpha A / (beta B))^(1 /
    (alpha + beta)) (Hoffmann et al. 2022, equation 4). Smaller than approaches 1-2 give (their table 3)."""
    k = APPROACH_3
    g = (k["alpha"] * k["A"] / (k["beta"] * k["B"])) ** (1 / (k["alpha"] + k["beta"]))
    return g * (compute / 6) ** (k["beta"] / (k["alpha"] + k["beta"]))


def llama_shape(n_target: float, vocab_size: int, max_seq_len: int) -> dict:
    """Model keys of a LLaMA-style shape with about `n_target` parameters (conventions in the module docstring)."""
    def params(h: int, layers: int) -> int:
        return _count(_shape(h, layers, vocab_size, max_seq_len)).total

    # The width whose LLaMA-proportioned model (H / 128 layers) is nearest in log size.
    h = min(WIDTHS, key=lambda w: abs(math.log(params(w, max(1, w // WIDTH_PER_LAYER)) / n_target)))
    # Then the layer count that lands nearest N.
    one = _count(_shape(h, 1, vocab_size, max_seq_len))
    outside = one.total - one.per_layer
    layers = max(1, round((n_target - outside) / one.per_layer))
    return _shape(h, layers, vocab_size, max_seq_len)


def _shape(h: int, layers: int, vocab_size: int, max_seq_len: int) -> dict:
    """The model keys of width `h` and `layers` layers by the conventions of the module docstring."""
    heads = h // HEAD_DIM
    return dict(family="llama", vocab_size=vocab_size, hidden_size=h, num_layers=layers, num_heads=heads,
                num_kv_heads=math.gcd(heads, GQA_KV_HEADS) if heads >= GQA_KV_HEADS else heads, head_dim=HEAD_DIM,
                intermediate_size=MULTIPLE_OF * math.ceil(8 * h / 3 / MULTIPLE_OF), max_seq_len=max_seq_len,
                tie_embeddings=False)


def _count(keys: dict):
    from ..config.schema import ModelConfig

    return count_params(ModelConfig(**keys))  # every other key at its default: a dense LLaMA block


def gpu_seconds(cfg) -> tuple[float, str]:
    b, gpus, price = cfg.budget, cfg.parallel.gpus, cfg.hardware.price_per_gpu_hour
    if b.gpu_hours is not None:
        return b.gpu_hours * 3600, f"budget.gpu_hours {b.gpu_hours:,g}"
    if b.days is not None:
        return b.days * 86400 * gpus, f"budget.days {b.days:g} x 24 x parallel.gpus {gpus}"
    return b.cost / price * 3600, f"budget.cost {b.cost:,g} / hardware.price_per_gpu_hour {price:g}"


def _in_budget_units(cfg, seconds: float) -> float:
    """GPU-seconds as the budget key given counts them (gpu_seconds the other way round)."""
    b = cfg.budget
    if b.gpu_hours is not None:
        return seconds / 3600
    if b.days is not None:
        return seconds / (86400 * cfg.parallel.gpus)
    return seconds / 3600 * cfg.hardware.price_per_gpu_hour


def _refuse_outside(cfg, seconds: float, low: float, high: float, what: str, utilisation: str) -> None:
    """One line naming the budget key and the range it supports (low and high in GPU-seconds)."""
    if low <= seconds <= high:
        return
    key = budget_key(cfg)
    given = getattr(cfg.budget, key.split(".")[1])
    raise ConfigError(f"{key}: {given:g} {what}; give {key} from {_in_budget_units(cfg, low):.3g} to "
                      f"{_in_budget_units(cfg, high):.3g} (on {cfg.hardware.gpu} at {utilisation})")


def spendable_compute(vocab_size: int, max_seq_len: int) -> tuple[float, float]:
    """The FLOPs budget mode can spend on a model it chooses: from C = 120 N^2 (N_opt = sqrt(C / 120)) at twice
    the smallest shape it builds (width 128, one layer), so that the inference-aware row's N_opt / 2 is a shape
    too, to C at the largest (width 65,536 at the planner's MAX_LAYERS). Beyond either end the shape no longer
    follows N_opt: a fixed smallest model on next to no tokens, or more layers than the planner models."""
    from . import MAX_LAYERS

    smallest = _count(_shape(WIDTHS[0], 1, vocab_size, max_seq_len)).total
    largest = _count(_shape(WIDTHS[-1], MAX_LAYERS, vocab_size, max_seq_len)).total
    return 120 * (INFERENCE_AWARE_SHRINK * smallest) ** 2, 120 * largest ** 2


def apply_budget(cfg, ex: Explain):
    """Choose the model for the budget, or with a model given buy its tokens: (the plan's "budget" entry, a
    new Config of that model with its train.tokens, the overrides that make it fit, and the budget keys
    cleared). `cfg` is left unchanged; the rest of the plan is the ordinary plan of the new config, and
    `budget.overrides` rebuilds it from `cfg`."""
    given = model_given(cfg)
    length = next((k for k in LENGTH_KEYS if getattr(cfg.train, k) is not None), None)
    if length:
        key, value = budget_key(cfg), f"train.{length}={getattr(cfg.train, length)}"
        if given:
            raise ConfigError(f"{key}: buys the training tokens of the model given ({given}), and {value} fixes "
                              f"them too; drop train.{length} to train on what the budget buys, or drop {key}")
        raise ConfigError(f"{key}: chooses the model and its tokens, and {value} fixes the tokens; drop train."
                          f"{length}, or give the model (model.preset or its shape keys) for the budget to buy its "
                          "tokens")
    seconds, how = gpu_seconds(cfg)
    peak, source = peak_tflops(cfg.hardware, cfg.train.precision)
    if not peak:
        raise ConfigError(f"budget: {source}; the compute a budget buys needs a peak FLOP/s")
    if given:
        return _buy_tokens(cfg, given, seconds, how, peak, ex)
    mfu = cfg.hardware.mfu
    per_second = peak * 1e12 * mfu  # compute of one GPU-second
    low, high = spendable_compute(cfg.model.vocab_size, cfg.model.max_seq_len)
    _refuse_outside(cfg, seconds, low / per_second, high / per_second, f"buys {seconds * per_second:.3g} FLOPs, "
                    f"whose Chinchilla-optimal N {math.sqrt(seconds * per_second / 120):.3g} is outside the "
                    f"{math.sqrt(low / 120):.3g} to {math.sqrt(high / 120):.3g} parameters budget mode builds",
                    f"hardware.mfu {mfu}")
    compute = seconds * per_second
    ex.add("budget", "gpu_hours", seconds / 3600, how)
    ex.add("budget", "compute_flops", compute, f"{seconds:.4g} GPU-seconds x {peak} TFLOP/s ({source}) x 1e12 "
           f"x hardware.mfu {mfu}")
    n_opt = math.sqrt(compute / (6 * CHINCHILLA_TOKENS_PER_PARAM))
    d_opt = CHINCHILLA_TOKENS_PER_PARAM * n_opt
    ex.add("budget", "params", n_opt, f"sqrt(C {compute:.4g} / 120): Hoffmann et al. 2022, approaches 1-2 "
           "(N_opt ~ C^0.5) with 20 tokens per parameter and C = 6ND")
    ex.add("budget", "tokens", d_opt, f"20 x N_opt {n_opt:.4g}")

    n_3 = approach_3_optimum(compute)
    best = chinchilla_loss(n_3, compute / (6 * n_3))
    ex.add("budget", "loss_optimum", best, f"L at approach 3's own optimum N = {n_3:.4g} (equation 4), D = C / 6N: "
           "the lowest loss its fit predicts for this compute; each row's loss_penalty is measured from it")
    optimal = _row(cfg, compute, n_opt, best, ex, "model")
    smaller = _row(cfg, compute, n_opt / INFERENCE_AWARE_SHRINK, best, ex, "inference_aware")
    smaller.pop("config_overrides")

    entry = {"compute_flops": compute, "gpu_hours": seconds / 3600, "params": n_opt, "tokens": d_opt,
             "model": optimal["model"], "model_params": optimal["params"], "model_tokens": optimal["tokens"],
             "loss": optimal["loss"], "loss_penalty": optimal["loss_penalty"], "loss_optimum": best,
             "approach_3_params": n_3, "storage_bytes": optimal["storage_bytes"],
             "raw_text_bytes": optimal["raw_text_bytes"], "fit": optimal["fit"], "inference_aware": smaller,
             "method": "Hoffmann et al. 2022 approaches 1-2: N_opt = sqrt(C / 120), D_opt = 20 N_opt; loss from "
                       "approach 3 (E 1.69, A 406.4, B 410.7, alpha 0.34, beta 0.28)"}
    # The plan that follows is the compute-optimal row's, with the overrides that make it fit.
    entry["overrides"] = {**optimal["config_overrides"], **NO_BUDGET}
    return entry, replaced(cfg, entry["overrides"])


def _buy_tokens(cfg, given: str, seconds: float, how: str, peak: float, ex: Explain):
    """The model given, trained on the tokens the budget's GPU-seconds buy at the plan's own time model
    (pretrain.plan.budget.wall_clock: FLOPs per token / (GPUs x peak x hardware.mfu, or hfu))."""
    counts = count_params(cfg.model)
    fl = flops(cfg, counts, 1, Explain())
    model_flops, hardware_flops, _ = basis(cfg, fl)
    per_token = wall_clock(cfg, model_flops, hardware_flops, peak, Explain())  # the time of one token
    token_seconds = per_token["gpu_hours"] * 3600  # GPU-seconds per token
    # At least one optimizer step, at most what train.tokens holds (int64).
    step = training_length(cfg, counts.total)["tokens_per_step"]
    tokens = int(seconds / token_seconds)
    _refuse_outside(cfg, seconds, step * token_seconds, LARGEST * token_seconds,
                    f"buys {tokens:,} tokens of the model given ({given}), "
                    + ("less than one optimizer step" if tokens < step else "more than train.tokens holds"),
                    f"hardware.{'hfu' if cfg.hardware.hfu else 'mfu'} {per_token['utilisation']}")
    n = counts.total
    compute = seconds * peak * 1e12 * per_token["utilisation"]
    n_3 = approach_3_optimum(6 * n * tokens)
    best = chinchilla_loss(n_3, tokens * n / n_3)
    loss = chinchilla_loss(n, tokens)
    ex.add("budget", "gpu_hours", seconds / 3600, how)
    ex.add("budget", "model_given", given, "the budget buys this model's tokens (it chooses a model only when "
           "none is given)")
    ex.add("budget", "model_tokens", tokens, f"{seconds:.4g} GPU-seconds / {token_seconds:.4g} GPU-seconds per "
           f"token ({per_token['basis']}, the plan's time)")
    ex.add("budget", "loss", loss, f"1.69 + 406.4 / {n:.4g}^0.34 + 410.7 / {tokens:.4g}^0.28 (Hoffmann et al. "
           "2022, approach 3)")
    ex.add("budget", "loss_penalty", loss - best, f"{loss:.4f} - {best:.4f}, the fit's optimum for C = 6ND "
           f"{6 * n * tokens:.4g} (at {n_3:.4g} params)")
    entry = {"gpu_hours": seconds / 3600, "compute_flops": compute, "model_given": given, "model_params": n,
             "model_tokens": tokens, "loss": loss, "loss_penalty": loss - best, "loss_optimum": best,
             "approach_3_params": n_3, "method": "tokens = GPU-seconds / GPU-seconds per token of the plan's time "
             "(FLOPs per token / (peak x hardware.mfu, or hardware FLOPs / hfu)); loss from Hoffmann et al. 2022's "
             "approach 3", "overrides": {"train.tokens": tokens, **NO_BUDGET}}
    return entry, replaced(cfg, entry["overrides"])


def _row(cfg, compute: float, n_target: float, best_loss: float, ex: Explain, name: str) -> dict:
    shape = llama_shape(n_target, cfg.model.vocab_size, cfg.model.max_seq_len)
    n = _count(shape).total
    tokens = int(compute / (6 * n))
    loss = chinchilla_loss(n, tokens)
    ex.add("budget", f"{name}.shape", f"H {shape['hidden_size']}, L {shape['num_layers']}, heads "
           f"{shape['num_heads']} (kv {shape['num_kv_heads']}), H' {shape['intermediate_size']}",
           f"LLaMA conventions near {n_target:.4g} params: head_dim 128, ~128 width per layer, H' = 8/3 H "
           "rounded up to 256, gcd(heads, 8) kv heads")
    ex.add("budget", f"{name}.params", n, "exact count of that shape (pretrain.plan.params)")
    ex.add("budget", f"{name}.tokens", tokens, f"C {compute:.4g} / (6 x {n:,}) = {tokens / n:.1f} tokens per parameter")
    ex.add("budget", f"{name}.loss", loss, f"1.69 + 406.4 / {n:.4g}^0.34 + 410.7 / {tokens:.4g}^0.28 "
           "(Hoffmann et al. 2022, approach 3)")
    ex.add("budget", f"{name}.loss_penalty", loss - best_loss, f"{loss:.4f} - loss_optimum {best_loss:.4f}")
    storage = storage_bytes(tokens, shape["vocab_size"])
    raw = tokens * cfg.data.bytes_per_token if cfg.data.bytes_per_token else None
    ex.add("budget", f"{name}.storage_bytes", storage, f"{tokens:,} tokens x {storage // max(1, tokens)} bytes"
           + (f"; raw text {raw:.4g} bytes at data.bytes_per_token {cfg.data.bytes_per_token}" if raw else
              "; set data.bytes_per_token (pretrain tokenizer stats) for the raw text it takes"))
    overrides = {f"model.{k}": v for k, v in shape.items()}
    overrides.update({"model.preset": None, "model.hf_config": None, "train.tokens": tokens,
                      "train.max_steps": None, "train.examples": None})
    fit = _fit(cfg, overrides)
    ex.add("budget", f"{name}.fits", fit["fits"], fit["why"])
    return {"model": shape, "params": n, "tokens": tokens, "loss": loss, "loss_penalty": loss - best_loss,
            "storage_bytes": storage,
            "raw_text_bytes": raw, "fit": {k: fit[k] for k in ("fits", "overrides", "memory_bytes")},
            "config_overrides": {**overrides, **fit["overrides"]}}


def _fit(cfg, overrides: dict) -> dict:
    """The ordinary plan of the shape on the budget's GPUs; when it does not fit, the cheapest fix that keeps
    the number of GPUs (pretrain.plan.fit_fixes)."""
    from . import plan_with_explain
    from .fit_fixes import fit_fixes

    c = replaced(cfg, {**overrides, **NO_BUDGET})
    p = plan_with_explain(c, advice=False)[0]
    total = p["memory_bytes"]["total"]
    if p["fits"] is not False:
        return {"fits": p["fits"], "overrides": {}, "memory_bytes": total,
                "why": f"as configured: {total / GiB:.1f} GiB per GPU"}
    for fix, q in fit_fixes(c):
        if fix.get("parallel.gpus", c.parallel.gpus) == c.parallel.gpus:
            text = " ".join(f"{k}={v}" for k, v in fix.items())
            return {"fits": True, "overrides": fix, "memory_bytes": q["memory_bytes"]["total"],
                    "why": f"with {text}: {q['memory_bytes']['total'] / GiB:.1f} GiB per GPU"}
    return {"fits": False, "overrides": {}, "memory_bytes": total,
            "why": f"{total / GiB:.1f} GiB per GPU and no fix on {c.parallel.gpus} GPUs"}


def render(budget: dict) -> list[str]:
    """The budget block printed above the plan of the chosen model (or of the model given)."""
    if "model_given" in budget:
        n, d = budget["model_params"], budget["model_tokens"]
        return [f"budget: {_hours(budget['gpu_hours'])} GPU-hours buy {d / 1e9:,.4g}B tokens for the model given "
                f"({budget['model_given']}): {n / 1e9:.3g}B params, {d / n:,.1f} tokens per parameter; predicted "
                f"loss {budget['loss']:.3f} (+{budget['loss_penalty']:.3f} above the compute-optimal size's "
                f"{budget['loss_optimum']:.3f} at {budget['approach_3_params'] / 1e9:.2f}B params)",
                "  (tokens from the plan's own time; without a model given the budget chooses it: docs/plan.md)", ""]

    def row(label, b):
        m = b["model"]
        fit = "fits" if b["fit"]["fits"] else "does NOT fit"
        extra = " ".join(f"{k}={v}" for k, v in b["fit"]["overrides"].items())
        return (f"  {label:<18} {b['params'] / 1e9:6.2f}B params on {b['tokens'] / 1e9:,.1f}B tokens "
                f"({b['tokens'] / b['params']:.0f}/param): H {m['hidden_size']}, L {m['num_layers']}, heads "
                f"{m['num_heads']}/{m['num_kv_heads']} kv, H' {m['intermediate_size']}; predicted loss "
                f"{b['loss']:.3f} (+{b['loss_penalty']:.3f}); {fit}" + (f" with {extra}" if extra else ""))

    opt = {"model": budget["model"], "params": budget["model_params"], "tokens": budget["model_tokens"],
           "loss": budget["loss"], "loss_penalty": budget["loss_penalty"], "fit": budget["fit"]}
    small = budget["inference_aware"]
    lines = [f"budget: {_hours(budget['gpu_hours'])} GPU-hours = {budget['compute_flops']:.3g} FLOPs; "
             f"Chinchilla-optimal N {budget['params'] / 1e9:.2f}B, D {budget['tokens'] / 1e9:,.1f}B tokens "
             f"(Hoffmann et al. 2022)",
             row("compute-optimal", opt),
             row("inference-aware", small),
             f"  predicted loss: Hoffmann et al.'s approach 3 fit; (+x) above its optimum {budget['loss_optimum']:.3f} "
             f"(at {budget['approach_3_params'] / 1e9:.2f}B params)",
             "  (the plan below is the compute-optimal row's; every figure explained by --explain)", ""]
    return lines


def _hours(hours: float) -> str:
    return f"{hours:,.0f}" if hours >= 100 else f"{hours:.3g}"  # 2,688 GPU-hours; 0.05 of one
