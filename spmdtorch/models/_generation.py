"""Fixed-shape text generation for Hugging Face causal LMs on "xla".

Why this exists: transformers' own decoding loop (``GenerationMixin._sample``)
grows three tensors by one column every token — ``input_ids``
(``torch.cat([input_ids, next_tokens])``), the 2-D ``attention_mask`` and
``position_ids`` — and the model reads the last two, so every token is a
program with new input shapes: one XLA compile per token even with
``cache_implementation="static"``. This cannot be fixed from outside that
loop (the ``cat`` is in its body), so here is a loop with the same inputs and
outputs whose every decode step has identical shapes:

* the prompt is left-padded to a length *bucket* (a power of two), with a
  2-D mask and position ids computed as transformers computes them, so a
  padded prompt gives the same tokens as the unpadded one;
* the KV cache is transformers' own ``StaticCache`` whose length is also a
  bucket (covering prompt bucket + new tokens), and the token and mask buffers
  have that length: each step writes its token and mask bit *by index* at the
  cache position, a device scalar (data, not shape);
* the 4-D attention mask is built in the step from those buffers with the
  model's registered mask function (no data-dependent ``.all()`` shortcut,
  which would be a host sync);
* the decode step runs under ``spmdtorch.compile``: traced twice, then replayed
  without Python tracing; the end-of-sequence check reads the previous step's
  flag while the current step runs.

So a generation compiles one prefill program and one decode program per
(batch, prompt bucket, cache bucket), whatever the number of new tokens.

It plugs into transformers through ``generate(custom_generate=...)``:
transformers prepares the generation config, logits processors (temperature,
top-k, top-p, repetition penalty, ...) and stopping criteria as usual and hands
them to :func:`static_decode`. :func:`generate` is the short form.

Invariants:
    * the cache slot of prompt position ``i`` (after left padding to ``P``) is
      ``i``; new token ``k`` (0-based) is at slot ``P + k``;
    * every buffer the decode step writes is preallocated before the first
      step, so the compiled step only reads and writes existing storages;
    * ``transformers`` is imported only inside functions (it is not a
      dependency of spmdtorch).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from spmdtorch.programs import compile as _spmd_compile
from spmdtorch.programs import sync as _sync
from spmdtorch.sharding import mark_sharding

__all__ = [
    "GenerationError",
    "GenerationStats",
    "bucket_length",
    "generate",
    "last_generation_stats",
    "static_decode",
]

# Processors that read ``input_ids`` only as the *set* of tokens seen so far
# (or not at all); they give eager's results on the fixed-size token buffer,
# whose unwritten slots repeat a token of the same row (see static_decode).
# (EtaLogitsWarper is left out: it calls torch._check on a tensor, a host read.)
_SUPPORTED_PROCESSORS = frozenset(
    {
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "RepetitionPenaltyLogitsProcessor",
        "SuppressTokensLogitsProcessor",
        "LogitNormalization",
        "InfNanRemoveLogitsProcessor",
    }
)
# Stopping criteria this loop implements itself (max length and EOS).
_SUPPORTED_CRITERIA = frozenset({"MaxLengthCriteria", "EosTokenCriteria"})

_MIN_PROMPT_BUCKET = 16
_MIN_CACHE_BUCKET = 32


class GenerationError(ValueError):
    """A generation option or model that the fixed-shape loop does not support.

    The message names the option, what was given and what to do instead
    (usually: call transformers' ``model.generate`` without ``custom_generate``).
    """


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationStats:
    """What the last :func:`static_decode` call did (see :func:`last_generation_stats`).

    Attributes:
        prompt_length: the prompt's length as given.
        prompt_bucket: the padded prompt length the prefill program ran with.
        cache_length: the static cache's length (the decode program's shape).
        new_tokens: tokens generated (after trimming steps past the stop).
        decode_steps: decode steps run (one per token after the first, plus at
            most one step past the end-of-sequence stop).
        prefill_s: seconds from the start to the first token on the host.
        decode_s: seconds of the decode loop, until its tokens were on the host.
    """

    prompt_length: int
    prompt_bucket: int
    cache_length: int
    new_tokens: int
    decode_steps: int
    prefill_s: float
    decode_s: float

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens after the first per second of decode, per sequence."""
        return (self.decode_steps / self.decode_s) if self.decode_s > 0 else float("nan")


_LAST_STATS: list[GenerationStats] = []


def last_generation_stats() -> GenerationStats | None:
    """The :class:`GenerationStats` of the latest :func:`static_decode` call, or None."""
    return _LAST_STATS[-1] if _LAST_STATS else None


def bucket_length(n: int, minimum: int) -> int:
    """The smallest power of two that is ``>= max(n, minimum)``.

    Example:
        >>> bucket_length(7, 16), bucket_length(17, 16), bucket_length(40, 32)
        (16, 32, 64)
    """
    n = max(int(n), int(minimum), 1)
    return 1 << (n - 1).bit_length()


def generate(model: Any, input_ids: torch.Tensor, **kwargs: Any) -> Any:
    """``model.generate(input_ids, **kwargs)`` with the fixed-shape loop of :func:`static_decode`.

    The inputs are handed to transformers on the CPU (its preparation, e.g.
    inferring the attention mask, then runs eagerly instead of compiling a
    small program for each prompt length) and moved to the model's device by
    the loop; the result is on ``input_ids``' device.

    Args:
        model: a transformers causal LM (``GenerationMixin``) on "xla".
        input_ids: ``(batch, length)`` prompt token ids, on any device.
        **kwargs: anything ``model.generate`` takes (``attention_mask``,
            ``max_new_tokens``, ``do_sample``, ``temperature``, ``top_k``,
            ``generation_config``...) plus :func:`static_decode`'s own
            options (``min_prompt_bucket``, ``min_cache_length``, ``compiled``,
            ``cache_sharding``).

    Returns:
        What ``model.generate`` returns: ``(batch, length + new)`` token ids.

    Example:
        >>> out = spmdtorch.models.generate(model, ids, max_new_tokens=16)  # doctest: +SKIP
    """
    if "custom_generate" in kwargs:
        raise GenerationError(
            "spmdtorch.models.generate: `custom_generate` was given; this function sets it to "
            "spmdtorch.models.static_decode. Call model.generate(...) directly to use another one."
        )
    device = input_ids.device
    cpu_kwargs = {
        k: (v.cpu() if k == "attention_mask" and isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()
    }
    out = model.generate(input_ids.cpu(), custom_generate=static_decode, **cpu_kwargs)
    return out.to(device) if isinstance(out, torch.Tensor) else out


def _check_options(logits_processor: Any, stopping_criteria: Any, generation_config: Any, streamer: Any) -> None:
    for proc in logits_processor:
        name = type(proc).__name__
        if name not in _SUPPORTED_PROCESSORS:
            raise GenerationError(
                f"static_decode: logits processor {name} is not supported (it reads the token history's length or "
                f"order, which the fixed-size buffer does not keep); supported: {sorted(_SUPPORTED_PROCESSORS)}. "
                "Drop the option that creates it, or call model.generate without custom_generate."
            )
    for crit in stopping_criteria:
        name = type(crit).__name__
        if name not in _SUPPORTED_CRITERIA:
            raise GenerationError(
                f"static_decode: stopping criterion {name} is not supported (only max length and EOS are checked "
                "on the device). Drop it, or call model.generate without custom_generate."
            )
    if streamer is not None:
        raise GenerationError("static_decode: `streamer` is not supported; pass streamer=None.")
    if generation_config.return_dict_in_generate:
        raise GenerationError(
            "static_decode: return_dict_in_generate=True is not supported (it returns per-step scores, "
            "attentions and the cache); pass return_dict_in_generate=False."
        )
    if getattr(generation_config, "num_beams", 1) not in (1, None):
        raise GenerationError(
            f"static_decode: num_beams={generation_config.num_beams}; only greedy and sampling (num_beams=1) "
            "are supported."
        )


def _mask_function(model: Any) -> Any:
    """The model's registered 4-D mask builder (``sdpa_mask``, ``eager_mask``...)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    impl = model.config._attn_implementation
    if impl not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise GenerationError(
            f"static_decode: attention implementation {impl!r} of {type(model).__name__} has no registered mask "
            f"function; supported: {sorted(ALL_MASK_ATTENTION_FUNCTIONS._global_mapping)}. Load the model with "
            "attn_implementation='sdpa' or 'eager'."
        )
    return ALL_MASK_ATTENTION_FUNCTIONS[impl]


def _check_model(model: Any) -> None:
    cfg = model.config
    if getattr(cfg, "is_encoder_decoder", False):
        raise GenerationError(
            f"static_decode: {type(model).__name__} is an encoder-decoder model; only decoder-only causal LMs are "
            "supported. Call model.generate without custom_generate."
        )
    text = cfg.get_text_config(decoder=True)
    layer_types = getattr(text, "layer_types", None) or []
    others = sorted({t for t in layer_types if t != "full_attention"})
    if others or getattr(text, "sliding_window", None) not in (None, 0):
        raise GenerationError(
            f"static_decode: {type(model).__name__} has layers of type {others or ['sliding_attention']}; only "
            "full causal attention is supported. Call model.generate without custom_generate."
        )


def static_decode(  # noqa: C901, PLR0915  (why: a transformers custom_generate method: option checks, prefill and the decode loop share the bucketed cache state; a candidate for splitting)
    model: Any,
    input_ids: torch.Tensor,
    logits_processor: Any,
    stopping_criteria: Any,
    generation_config: Any,
    synced_gpus: bool = False,
    streamer: Any = None,
    min_prompt_bucket: int = _MIN_PROMPT_BUCKET,
    min_cache_length: int = _MIN_CACHE_BUCKET,
    compiled: bool = True,
    cache_sharding: Any = None,
    **model_kwargs: Any,
) -> torch.Tensor:
    """A transformers decoding method (``model.generate(custom_generate=static_decode)``) with fixed shapes.

    Greedy or sampled decoding (``do_sample``; num_beams=1) of a decoder-only
    model with full causal attention, giving the tokens of transformers' own
    loop (greedy: the same tokens; sampled: draws from the same distribution,
    from spmdtorch's random stream). See the module docstring for how.

    Args:
        model: the causal LM (its device is where the loop runs).
        input_ids: ``(batch, length)`` prompts, on any device.
        logits_processor: prepared by ``model.generate``.
        stopping_criteria: prepared by ``model.generate``.
        generation_config: prepared by ``model.generate``.
        synced_gpus: must be False.
        streamer: must be None.
        min_prompt_bucket: the smallest prompt bucket (prompts are padded to a
            power of two at least this long).
        min_cache_length: the smallest cache length (a power of two at least
            prompt bucket + new tokens, and at least this).
        compiled: run the decode step under ``spmdtorch.compile`` (else lazily,
            one sync per step; same programs, more host time).
        cache_sharding: None, or ``(mesh, partition_spec)`` applied with
            ``mark_sharding`` to every cache key/value tensor
            ``(batch, kv_heads, length, head_dim)`` after the prefill, e.g.
            ``(mesh, (None, "tp", None, None))`` for tensor-parallel heads.
        **model_kwargs: ``attention_mask`` (2-D), ``use_cache``; the cache and
            position ids transformers prepared are replaced by the loop's own.

    Returns:
        ``(batch, length + new_tokens)`` token ids on ``input_ids``' device.

    Raises:
        GenerationError: an option or model the loop does not support (named
            in the message, with the alternative).
    """
    from transformers.cache_utils import StaticCache
    from transformers.masking_utils import causal_mask_function

    if synced_gpus:
        raise GenerationError("static_decode: synced_gpus=True is not supported (one process drives all devices).")
    _check_options(logits_processor, stopping_criteria, generation_config, streamer)
    _check_model(model)
    user_cache = model_kwargs.pop("cache", None)
    if getattr(user_cache, "_is_user_defined", False):
        raise GenerationError(
            "static_decode: a `cache` object was passed; the loop builds its own StaticCache of a bucketed length. "
            "Do not pass `cache` (cache_implementation is ignored)."
        )
    model_kwargs.pop("position_ids", None)
    model_kwargs.pop("use_cache", None)
    model_kwargs.pop("logits_to_keep", None)  # the loop keeps only the last position's logits itself
    attention_mask = model_kwargs.pop("attention_mask", None)
    extra = sorted(k for k, v in model_kwargs.items() if v is not None)
    if extra:
        raise GenerationError(
            f"static_decode: model inputs {extra} are not supported (only input_ids and a 2-D attention_mask). "
            "Call model.generate without custom_generate."
        )

    t0 = time.perf_counter()
    device = next(model.parameters()).device
    out_device = input_ids.device
    ids_cpu = input_ids.detach().cpu().long()
    batch, length = ids_cpu.shape
    mask_cpu = torch.ones_like(ids_cpu) if attention_mask is None else attention_mask.detach().cpu().long()
    if mask_cpu.shape != ids_cpu.shape:
        raise GenerationError(
            f"static_decode: attention_mask has shape {tuple(mask_cpu.shape)}, input_ids {tuple(ids_cpu.shape)}; "
            "pass a 2-D (batch, length) mask of 0/1 matching input_ids."
        )
    max_new = int(generation_config.max_length) - length
    if max_new < 1:
        raise GenerationError(
            f"static_decode: max_length={generation_config.max_length} leaves {max_new} new tokens for a prompt of "
            f"{length}; pass max_new_tokens >= 1."
        )
    prompt_bucket = bucket_length(length, min_prompt_bucket)
    cache_len = bucket_length(prompt_bucket + max_new, min_cache_length)
    pad = prompt_bucket - length

    # Host-side preparation (no programs): left-pad to the bucket; position ids
    # as transformers computes them from the mask (cumsum - 1, 0 on padding);
    # unwritten token slots repeat the row's first real token so that
    # set-based processors (repetition penalty) see exactly the real tokens.
    first_real = mask_cpu.argmax(dim=1)
    filler = ids_cpu.gather(1, first_real[:, None])  # (batch, 1)
    tokens = filler.expand(batch, cache_len).clone()
    tokens[:, pad:prompt_bucket] = ids_cpu
    mask2d = torch.zeros(batch, cache_len, dtype=torch.long)
    mask2d[:, pad:prompt_bucket] = mask_cpu
    pos_prompt = (mask2d[:, :prompt_bucket].cumsum(-1) - 1).clamp_min(0)
    next_pos = mask_cpu.sum(-1, keepdim=True)  # (batch, 1): position id of the first new token
    eos = generation_config._eos_token_tensor
    eos_ids = torch.zeros(0, dtype=torch.long) if eos is None else eos.detach().cpu().long().reshape(-1)
    pad_token = generation_config._pad_token_tensor
    pad_id = (
        int(pad_token.detach().cpu().reshape(-1)[0])
        if pad_token is not None
        else (int(eos_ids[0]) if len(eos_ids) else 0)
    )
    do_sample = bool(generation_config.do_sample)

    to = lambda t: t.to(device)
    tokens, mask2d, pos_prompt, next_pos = to(tokens), to(mask2d), to(pos_prompt), to(next_pos)
    eos_dev = to(eos_ids) if len(eos_ids) else None
    slot = to(torch.tensor(prompt_bucket, dtype=torch.long))  # cache slot of the next token
    unfinished = to(torch.ones(batch, dtype=torch.bool))
    ones_b = to(torch.ones(batch, 1, dtype=torch.long))
    pad_b = to(torch.full((batch,), pad_id, dtype=torch.long))
    new_tokens = to(torch.zeros(batch, max(cache_len - prompt_bucket, 1), dtype=torch.long))
    step_index = to(torch.tensor(0, dtype=torch.long))  # column of new_tokens to write

    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    mask_fn = _mask_function(model)
    dtype = model.dtype

    def build_mask(q_len: int, q_offset: torch.Tensor) -> Any:
        return mask_fn(
            batch_size=batch,
            q_length=q_len,
            kv_length=cache_len,
            q_offset=q_offset,
            kv_offset=0,
            mask_function=causal_mask_function,
            attention_mask=mask2d.bool(),
            allow_is_causal_skip=False,
            dtype=dtype,
            config=model.config,
            device=device,
        )

    def choose(logits: torch.Tensor) -> torch.Tensor:
        """Next tokens from last-position logits, as transformers' ``_sample`` does."""
        scores = logits_processor(tokens, logits.to(torch.float32))
        if do_sample:
            probs = torch.nn.functional.softmax(scores, dim=-1)
            nxt = torch.multinomial(probs, num_samples=1).squeeze(1)
        else:
            nxt = torch.argmax(scores, dim=-1)
        nxt = torch.where(unfinished, nxt, pad_b)
        return nxt

    def record(nxt: torch.Tensor) -> None:
        """Write the chosen tokens at ``slot`` (data) and update the finished flags."""
        tokens.index_copy_(1, slot.view(1), nxt[:, None])
        new_tokens.index_copy_(1, step_index.view(1), nxt[:, None])
        if eos_dev is not None:
            unfinished.logical_and_(~torch.isin(nxt, eos_dev))

    # Prefill: one program for the padded prompt; its logits at the last
    # column (the last real token, thanks to left padding) give token 0.
    prefill_ids = tokens[:, :prompt_bucket].clone()
    out = model(
        input_ids=prefill_ids,
        attention_mask=build_mask(prompt_bucket, torch.zeros((), dtype=torch.long, device=device)),
        position_ids=pos_prompt,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    nxt = choose(out.logits[:, -1])
    mask2d.index_fill_(1, slot.view(1), 1)
    record(nxt)
    flag = unfinished.any()  # computed by the prefill program, not a program of its own
    _sync()
    if cache_sharding is not None:
        _shard_cache(cache, cache_sharding)

    def decode_step(cur: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token: the forward at ``slot`` + choose + write at ``slot + 1``."""
        o = model(
            input_ids=cur[:, None],
            attention_mask=build_mask(1, slot),
            position_ids=next_pos,
            cache=cache,
            use_cache=True,
        )
        next_pos.add_(ones_b)
        slot.add_(1)
        step_index.add_(1)
        mask2d.index_fill_(1, slot.view(1), 1)
        n = choose(o.logits[:, -1])
        record(n)
        return n, unfinished.any()

    step = _spmd_compile(decode_step) if compiled else decode_step
    nxt.cpu()  # the prefill's token on the host: time to first token
    t1 = time.perf_counter()
    # Token k's flag is read while step k + 1 runs (one step late), so the
    # host never waits for the device between steps; a step run past the stop
    # is dropped below. Without EOS ids there is nothing to check.
    cur = nxt
    n_new = max_new
    steps = 0
    for k in range(1, max_new):
        prev_flag = flag
        cur, flag = step(cur)
        steps += 1
        if not compiled:
            _sync()
        if eos_dev is not None and not bool(prev_flag.cpu()):
            n_new = k  # every row was finished after token k - 1: tokens 0..k-1
            break
    gen = new_tokens.cpu()[:, :n_new]
    t2 = time.perf_counter()
    _LAST_STATS[:] = [
        GenerationStats(
            prompt_length=length,
            prompt_bucket=prompt_bucket,
            cache_length=cache_len,
            new_tokens=n_new,
            decode_steps=steps,
            prefill_s=t1 - t0,
            decode_s=t2 - t1,
        )
    ]
    result = torch.cat([input_ids.detach().cpu().long(), gen], dim=1).to(input_ids.dtype)
    return result.to(out_device)


def _shard_cache(cache: Any, cache_sharding: Any) -> None:
    mesh, spec = cache_sharding
    for layer in cache.layers:
        mark_sharding(layer.keys, mesh, spec)
        mark_sharding(layer.values, mesh, spec)
