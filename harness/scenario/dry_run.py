"""Schedule a scenario's whole timeline with the real allocators, to find pools too small for it, and
count what the timeline makes a run keep (snapshots per step, the largest forward: ``memory``).

Slot assignment depends on the timeline alone (tokens are teacher-forced), so no model or backend is
needed, and the pool is built without layers: the dry run exercises slot bookkeeping only. It recognises
what went wrong by exception type, never by message. Loading a file never imports code it names, so a
serving stack or eviction policy named by import path (or a stack of an optional install) is stood in for
by the miniature and the tight policy (which frees soonest: a pool too small under it is too small under any policy).
"""

from __future__ import annotations

from ..runspec import Problem
from ..serving.pool import PoolExhausted
from ..serving.eviction import EvictionSpec
from ..serving.registry import EVICTION_POLICIES, OPTIONAL_STACKS, STACKS, eviction_policy, stack_class
from ..serving.scheduler import Scheduler, TimelineTooLong
from ..serving.stack import StackSpec
from .memory import timeline_memory_problems
from .spec import ScenarioSpec


def dry_run(spec: ScenarioSpec, *, load_policy: bool = False) -> list[Problem]:
    """The problem that stops the timeline, if any; run it only on a spec whose ``problems()`` are empty.
    ``load_policy``: schedule with the spec's eviction policy even when an import path names it (a caller that
    has it installed: the SGLang target moving a scenario onto SGLang's eviction), not the tight stand-in."""
    serving = spec.serving if spec.serving in STACKS and spec.serving not in OPTIONAL_STACKS else "miniature"
    eviction = (spec.eviction if load_policy or spec.eviction.policy in EVICTION_POLICIES
                else EvictionSpec(prefix_cache=spec.eviction.prefix_cache))
    stack = stack_class(serving).build(
        StackSpec(pool=spec.pool, layer_is_swa=(), num_kv_heads=1, head_dim=1, poison_freed=False)
    )
    sched = Scheduler(
        spec.timeline,
        stack=stack,
        eviction=eviction_policy(eviction, window=spec.model.window, page_size=spec.pool.page_size),
        vocab_size=spec.model.vocab_size,
    )
    step_tokens: list[int] = []
    largest = (0, 0)  # (tokens, step) of the first of the largest forwards
    try:
        while (step := sched.next_step()) is not None:
            if step.batch.verify is not None:  # no forward runs here: the verify's slot bookkeeping does
                step.batch.verify.build()
                step.batch.verify.release_rejected()
            step_tokens.append(sum(len(forward) for forward in step.forwards))
            for forward in step.forwards:
                if len(forward) > largest[0]:
                    largest = (len(forward), step.index)
            sched.finish_step()
    except PoolExhausted as exc:
        return [Problem(f"pool.{exc.field}", f"too small for the timeline: {exc.message} (at step {sched.step_index})")]
    except TimelineTooLong as exc:
        return [Problem("timeline.max_steps", f"too small: {exc}")]
    except Exception as exc:  # noqa: BLE001 - whatever the file causes is reported, never a traceback
        return [Problem("timeline", f"the dry run failed at step {sched.step_index}: {type(exc).__name__}: {exc}")]
    return timeline_memory_problems(spec.model, spec.pool, step_tokens=step_tokens, largest_forward=largest)
