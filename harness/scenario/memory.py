"""What a scenario makes the harness allocate beyond the weights and the pools, bounded at load time.

Each field of a scenario can be within its own bounds while a combination of them exhausts the machine
at run time, in every run, as an allocator error: a decode bucket of 2^20 rows with ``max_context_len =
4096`` needs 64 GiB of page tables, and pools of 2^18 slots snapshotted whole at every step took the
reference run to 11.5 GiB (snapshots now keep only what a step changed). The estimates here follow what
the harness allocates, so that such a file is refused when it is loaded, with one line per bound, as the
other bounds are:

- **decode graphs** (``full`` mode): the backend's two static page tables, ``max(decode_buckets) x
  max_context_len`` int64 each, and each captured bucket's forward, whose attention intermediates per
  layer the graph keeps (the torch-native kernel gathers a whole page-table row of K and V per token);
- **piecewise capture** (``piecewise`` mode): each prefill bucket is captured by running the whole bucket,
  attention included, once;
- **the largest forward** of the timeline (the dry run counts it): its attention over ``max_context_len``
  page-table columns, one layer at a time;
- **snapshots and the diff**: a step's snapshot keeps the rows it changed (the slots it wrote and
  freed, every layer) and its hidden states, a run keeps all of its steps (the reference run's too), and
  the diff rebuilds the pools whole three times (``check.diff.snapshot.Cursor``).

The bound for each is ``RUN_MEMORY_LIMIT``, the one the weights and KV buffers already obey.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..runspec import RUN_MEMORY_LIMIT, GraphSpec, Mode, Problem
from ..serving.model_spec import ModelSpec
from ..serving.pool_spec import PoolSpec

_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8_e4m3": 1}
_INDEX_BYTES = 8  # int64 page-table entries and slot indices
_LOG_BYTES = 4  # an int32 write-log entry per slot and layer
_DIFF_POOLS = 3


def _limit() -> str:
    return f"more than the {RUN_MEMORY_LIMIT >> 20} MiB a run may use"


def _mib(n: int) -> int:
    return max(1, n >> 20)


def attention_bytes_per_column(model: ModelSpec, pool: PoolSpec) -> int:
    """Bytes one token's attention over one page-table column allocates in one layer.

    The slot index; K and V gathered in the storage dtype, converted to the compute dtype when it differs
    (FP8 through float32) and made contiguous; scores, their mask and softmax in float32 per query head,
    the probabilities in the compute dtype, and the validity mask. Measured on the torch-native backend:
    a bucket of 256 rows over 4096 columns keeps 2.3 GiB in a 4-layer model, as estimated.
    """
    kv = model.num_kv_heads * model.head_dim
    compute, storage = _BYTES.get(model.dtype, 4), _BYTES.get(pool.kv_dtype, 4)
    convert = 0 if pool.kv_dtype == model.dtype else compute + (4 if pool.kv_dtype == "fp8_e4m3" else 0)
    return _INDEX_BYTES + 2 * kv * (storage + convert + compute) + model.num_heads * (3 * 4 + compute) + 1


def graph_memory_problems(model: ModelSpec, pool: PoolSpec, graphs: GraphSpec, modes: Iterable[str]) -> list[Problem]:
    """The decode graphs' and the piecewise capture's memory, for the modes the scenario runs."""
    modes = set(modes)
    width = pool.max_context_len
    cell = attention_bytes_per_column(model, pool)
    out = []
    if Mode.FULL in modes and graphs.decode_buckets:
        largest = max(graphs.decode_buckets)
        page_tables = 2 * largest * width * _INDEX_BYTES
        captured = sum(graphs.decode_buckets) * width * cell * model.num_layers
        if page_tables + captured > RUN_MEMORY_LIMIT:
            out.append(Problem("graphs.decode_buckets", (
                f"the decode graphs need {_mib(page_tables + captured)} MiB (page tables of {largest} rows x "
                f"{width} columns, {_mib(page_tables)} MiB, and each bucket's captured attention over them), "
                f"{_limit()}; shrink the buckets or pool.max_context_len")))
    if Mode.PIECEWISE in modes and graphs.prefill_buckets:
        largest = max(graphs.prefill_buckets)
        capture = largest * width * cell
        if capture > RUN_MEMORY_LIMIT:
            out.append(Problem("graphs.prefill_buckets", (
                f"capturing the {largest}-token bucket attends over {width} columns: {_mib(capture)} MiB, "
                f"{_limit()}; shrink the buckets or pool.max_context_len")))
    return out


def pool_bytes(model: ModelSpec, pool: PoolSpec) -> int:
    """Bytes of both pools whole: every layer, K and V, and the write log."""
    n_swa = sum(model.layer_is_swa)
    return pool.full_size * _slot_bytes(model, pool, model.num_layers - n_swa) + pool.swa_size * _slot_bytes(model, pool, n_swa)


def _slot_bytes(model: ModelSpec, pool: PoolSpec, layers: int) -> int:
    return layers * (model.num_kv_heads * model.head_dim * 2 * _BYTES.get(pool.kv_dtype, 4) + _LOG_BYTES)


def snapshot_bytes(model: ModelSpec, pool: PoolSpec, slots: int, tokens: int) -> int:
    """Bytes of one step's snapshot that changed ``slots`` slots of each pool and computed ``tokens`` hidden
    states: their rows in every layer, K and V, their write-log entries and their indices."""
    n_swa = sum(model.layer_is_swa)
    per_slot = _slot_bytes(model, pool, model.num_layers - n_swa) + _slot_bytes(model, pool, n_swa) + 2 * _INDEX_BYTES
    return slots * per_slot + tokens * model.hidden_size * _BYTES.get(model.dtype, 4)


def timeline_memory_problems(model: ModelSpec, pool: PoolSpec, *, step_tokens: list[int],
                             largest_forward: tuple[int, int]) -> list[Problem]:
    """The bounds that need the dry run: ``step_tokens`` (tokens written per step) and ``largest_forward``
    (tokens, step) of the largest forward."""
    out = []
    # A step changes the slots it writes, the slots it frees (re-poisoned; a slot is freed at most once per
    # write, so the frees of a run are bounded by its writes) and the dummy page its padded rows write.
    changed = sum(snapshot_bytes(model, pool, 2 * tokens + pool.page_size, tokens) for tokens in step_tokens)
    whole = pool_bytes(model, pool)
    # the diff, after both runs: both runs' snapshots and three working copies of the pools
    need = _DIFF_POOLS * whole + 2 * changed
    if need > RUN_MEMORY_LIMIT:
        out.append(Problem("pool" if _DIFF_POOLS * whole >= 2 * changed else "timeline", (
            f"the diff rebuilds each step's pools {_DIFF_POOLS} times (the subject's at the step and the step "
            f"before, the reference's), {_DIFF_POOLS} x {_mib(whole)} MiB, and keeps both runs' snapshots of "
            f"what their {len(step_tokens)} steps change, {_mib(2 * changed)} MiB: {_mib(need)} MiB, {_limit()}; "
            "shrink full_size or swa_size, or the timeline")))
    tokens, step = largest_forward
    attention = tokens * pool.max_context_len * attention_bytes_per_column(model, pool)
    if attention > RUN_MEMORY_LIMIT:
        out.append(Problem("timeline", (
            f"the forward of {tokens} tokens at step {step} attends over {pool.max_context_len} page-table "
            f"columns: {_mib(attention)} MiB, {_limit()}; shrink chunk_size, the prompts or pool.max_context_len")))
    return out
