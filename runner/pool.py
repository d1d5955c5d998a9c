"""``Pool``: pre-created, pre-started sandboxes for one key (image, policy, workspace, tools), each
adopted by exactly one run and then destroyed: never reused, never handed to a second run.

A slot is a started container (and, for ``network.mode: proxy``, its egress proxy, network and
volume) whose worker has answered a ``ping``. A run that adopts it (``Sandbox(pool=pool)``)
sends its per-run settings over the protocol (``sandbox.configure``: its secrets, its run
deadline), never through the container's environment, which was fixed before the run existed.
Labels cannot change after create, so a slot's id *is* the run id of the one run that adopts it:
``docker ps`` and the audit log's ``run.started``/``run.finished`` name the same run. Slots are
refilled in the background, at most ``size`` wait at once, and one unused for ``idle_s`` is
removed (the pool goes cold when nobody asks). Every slot carries the owner and deadline labels,
so ``toolcage gc`` and the reaper remove what a SIGKILLed owner left.

Other images (an eval loop over per-task images): ``pool.sandbox(image=REF)`` takes a slot of REF.
Each image other than the pool's own gets its slots from a sub-pool made when first asked for
(same policy, workspace, tools and limits; slots started with the same runtime mounts as a cold
run of that image), filled on demand: a slot starts when a run asks and waits for it, or ahead of
time with ``pool.warm(REF, n)``; ``per_image`` keeps that many of each image asked for warm. Warm
slots across those images are bounded by ``max_warm``: asking for one more evicts the waiting slots
of the image asked for least recently. A sub-pool with nothing waiting, starting or asked for during
``idle_s`` ends (its threads too); ``close()`` closes them all. Their starts share one gate of
``parallel`` (a burst over many images starts no more containers at once than one image would).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from secrets import token_hex
from typing import IO, Any

from toolcage import logs, telemetry, timing
from toolcage.backends import Backend, ExitStatus, in_container
from toolcage.engine import ownership
from toolcage.engine.api import EngineAPI
from toolcage.engine.labels import SLOT_GRACE_S, RunSpec
from toolcage.errors import ToolcageError, UsageError
from toolcage.lifecycle import removal
from toolcage.lifecycle.audit import Audit
from toolcage.options import RunOptions
from toolcage.policies import PolicySource, contract
from toolcage.rpc.session import Ended, Session
from toolcage.run import Run

READY_WAIT_S = 30.0  # a slot's worker must answer its first ping within this
FAIL_BACKOFF_S = (0.5, 5.0)  # after a slot failed to start: first and longest pause before the next try
ADOPT_MARGIN_S = 1.0  # a slot is handed out only with run_s + this much of its life left (see _has_a_run_left)
# a replacement starts this long after its slot was taken, not at once: starting a container keeps
# both cores of a small host busy (dockerd, runc), and the run that just adopted a slot would wait
# behind it for its first answers. Every slot waiting when the run began is still there to take.
REFILL_DELAY_S = 0.05


class Slot:
    """One pre-started sandbox. Until a run adopts it, its session's callbacks land here; after, on the run.
    (Internal: what ``take()`` hands a Sandbox, and ``toolcage.aio`` an async taker, to adopt.)"""

    def __init__(self, pool: Pool, run: Run, backend: Backend) -> None:
        self.pool, self.run, self.backend = pool, run, backend  # the prestarted run the adopter takes over
        self.run_id, self.name = run.run_id, run.name
        # the adopting run's log, protocol-violation handler and redaction (adopted_by); None until then
        self.owner: tuple[Any, Callable[[str], None], Callable[[Any], Any] | None] | None = None
        self.created = time.monotonic()
        self.created_at = datetime.now(UTC).isoformat(timespec="milliseconds")
        self.image_id: str | None = None
        self.deadline = float("inf")  # epoch seconds: when its container, worker and proxy stop (set when made)
        self.session: Session | None = None
        self.retired = False
        self.ahead = False  # taken as one of the slots its pool was asked to start ahead (Pool.warm)

    def adopted_by(self, log: Any, on_broken: Callable[[str], None], redact: Callable[[Any], Any] | None) -> Backend:
        """The run that took the slot: from now on the session's callbacks reach it (no reaching into it).
        Returns what that run sees of the slot's backend (:class:`AdoptedBackend`)."""
        self.owner = (log, on_broken, redact)
        return AdoptedBackend(self)

    # the session's callbacks (reader thread) ------------------------------------------------
    def stderr_line(self, line: str) -> None:
        owner = self.owner
        (owner[0] if owner is not None else self.pool.log).debug("worker.stderr", line=line, run_id=self.run_id)

    def broken(self, reason: str) -> None:
        owner = self.owner
        if owner is not None:
            owner[1](reason)
        else:  # nobody's run yet: it is simply not handed out
            self.pool.log.warning("pool.slot_broken", run_id=self.run_id, reason=reason)
            self.backend.kill()

    def redact(self, obj: Any) -> Any:
        owner = self.owner
        redact = owner[2] if owner is not None else None
        return redact(obj) if redact is not None else obj


class AdoptedBackend:
    """The adopting run's view of a pool's slot: kill at once, removal in the pool's background."""

    sandbox_user = True

    def __init__(self, slot: Slot) -> None:
        self._slot = slot
        self.container_id = slot.backend.container_id  # started before adoption: known, and never changes

    def image_id(self) -> str | None:
        return self._slot.image_id  # read when the slot was made: no engine trip

    def complete(self, run: RunSpec) -> RunSpec:
        return run  # its spec was completed when the slot started

    def start(self, run: RunSpec, parser: Any) -> Any:
        raise UsageError("a pooled sandbox is started by its pool")

    def kill(self) -> None:
        self._slot.backend.kill()

    def check_network_changeable(self) -> None:
        """As the slot's own backend (a live network change: its proxy, started with the slot)."""
        check = getattr(self._slot.backend, "check_network_changeable", None)
        if check is None:
            raise UsageError("this pool's sandboxes have no egress proxy: their network cannot change")
        check()

    def update_network(self, policy: Any) -> dict[str, Any]:
        self.check_network_changeable()
        return dict(getattr(self._slot.backend, "update_network")(policy))  # noqa: B009 - checked just above

    def exit_status(self, timeout: float) -> ExitStatus:
        return self._slot.backend.exit_status(timeout)

    def remove(self, keep: bool) -> None:
        self._slot.pool._retire(self._slot, "used")  # off the caller's path: the pool's remover does it


# an async taker's side of a hand-off: called under the pool's lock with its slot (or the error that
# stops slots from starting), from any thread; never blocks; False: nobody can take the slot any more
Handoff = Callable[["Slot | ToolcageError"], bool]

_POOLS: weakref.WeakSet[Pool] = weakref.WeakSet()


@atexit.register
def _close_pools() -> None:
    for pool in list(_POOLS):
        with contextlib.suppress(Exception):
            pool.close()


class Pool:
    """Warm sandboxes for one key; ``with pool.sandbox() as sb:`` (or ``Sandbox(pool=pool)``) adopts one.

    ``size``: how many wait at most; ``idle_s``: a slot unused this long is removed (default: the
    policy's ``timeouts.idle_s``); ``parallel``: how many start at once; ``run_s``, ``memory``, ``scratch``:
    those knobs of the policy for every run it serves (as on :class:`Sandbox`). A context manager;
    ``close()`` removes every slot not yet adopted (adopted ones go when their run closes).

    Other images (``pool.sandbox(image=REF)``, ``pool.warm(REF, n)``): ``per_image``: how many slots each
    image asked for keeps warm (default 0: a slot starts when a run asks); ``max_warm``: at most this
    many warm slots across those images (default ``size``), the least recently asked-for evicted first.

    Coding tasks (``workspace_mode="copy"``, ``workspace_gitignore``: as on :class:`Sandbox`): each slot waits
    with an empty writable ``/workspace``; the run that adopts it fills it with a fresh copy of ``workspace``,
    so a pooled start costs the copy's fill alone. ``pool.sandbox(resume=SNAPSHOT)`` fills a slot with a
    snapshot's files instead (its workspace copy needs a copy pool; a snapshot without one, a pool without).

        with Pool(size=2, max_warm=4) as pool:         # an eval loop over per-task images
            for task in tasks:
                pool.warm(next_image(task))            # optional: start the next one's slot ahead
                with pool.sandbox(image=task.image) as sb:
                    ...
    """

    def __init__(
        self,
        policy: PolicySource = "default",
        *,
        workspace: str | os.PathLike[str] | None = None,
        tools: Iterable[str | os.PathLike[str]] = (),
        size: int = 2,
        idle_s: float | None = None,
        parallel: int | None = None,
        tool: str = "pool",
        sandbox: str | None = None,
        image: str | None = None,
        run_timeout: float | None = None,
        engine: EngineAPI | None = None,
        egress_network: str | None = None,
        egress_proxy: str | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        audit: Any = None,
        start_gate: threading.Semaphore | None = None,
        run_s: float | None = None,
        memory: int | str | None = None,
        scratch: int | str | None = None,
        per_image: int = 0,
        max_warm: int | None = None,
        workspace_mode: str = "ro",
        workspace_gitignore: bool = False,
    ) -> None:
        # start_gate: held while a slot starts, shared with whatever else starts containers on the same
        # engine (a cluster node's agent caps its engine's concurrent starts with one: toolcage.ray)
        self.start_gate = start_gate
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise UsageError("pool size must be a positive integer")
        if isinstance(per_image, bool) or not isinstance(per_image, int) or per_image < 0:
            raise UsageError("pool per_image must be a non-negative integer")
        if max_warm is not None and (isinstance(max_warm, bool) or not isinstance(max_warm, int) or max_warm < 0):
            raise UsageError("pool max_warm must be a non-negative integer (or None: size)")
        self.options = RunOptions.resolve(
            policy, tool=tool, sandbox=sandbox, image=image, workspace=workspace, tools=tools,
            run_timeout=run_timeout, engine=engine, egress_network=egress_network, egress_proxy=egress_proxy,
            ca_file=ca_file, audit=audit, run_s=run_s, memory=memory, scratch=scratch,
            workspace_mode=workspace_mode, workspace_gitignore=workspace_gitignore,
        )  # fmt: skip
        self.size = size
        self.idle_s = float(idle_s if idle_s is not None else self.options.policy.timeouts.idle_s)
        if self.idle_s <= 0:
            raise UsageError("pool idle_s must be a positive number of seconds")
        self.parallel = max(1, min(parallel or min(size, 2), size))
        self.per_image = per_image
        self.max_warm = size if max_warm is None else max_warm
        self._setup(token_hex(4), keep=size, parent=None)
        self.options.warn_unreadable_workspace(self.log, in_container(self.kind))

    def _setup(self, pool_id: str, keep: int, parent: Pool | None) -> None:
        """What a pool and an image's sub-pool (``_for_image``) both are, once ``options``, ``size``,
        ``idle_s``, ``parallel`` and ``start_gate`` are set; starts the fillers."""
        self.policy, self.kind, self.image, self.tool = (
            self.options.policy,
            self.options.kind,
            self.options.image,
            self.options.tool,
        )
        self.workspace, self.tool_sources = self.options.workspace, self.options.tool_sources
        # what a slot readies while it waits: a run's secrets and connectors need modules a bare run never loads
        bare = not self.tool_sources and not self.policy.secrets
        self._pooled_env = contract.POOLED_BARE if bare else "1"
        self.audit: Audit | None = self.options.audit
        self.id = pool_id
        self.parent = parent
        self.log = logs.get_logger(pool=self.id) if parent is None else logs.get_logger(pool=self.id, image=self.image)
        self._cond = threading.Condition()
        self._ready: collections.deque[Slot] = collections.deque()
        self._starting = 0
        self._waiting = 0  # takers waiting: threads in take(), and async takers (_handoffs)
        # how many wait ready when nobody asks: _keep is refilled after a take (size; a sub-pool's per_image),
        # _extra is not (a sub-pool's warm(): started ahead for runs to come, each taken once)
        self._keep, self._extra = keep, 0
        # async takers (toolcage.aio), oldest first: handed a slot, or what stops slots from starting, by
        # whichever thread has it (a filler, mostly); no thread waits for them
        self._handoffs: collections.deque[Handoff] = collections.deque()
        self._watchers: list[Callable[[], None]] = []  # told of every change (an async wait_ready)
        self._closed = False
        self._error: ToolcageError | None = None
        self._failures = 0
        self._last_used = time.monotonic()  # a new pool fills at once
        self._last_taken = 0.0
        self.adopted = 0  # runs served
        self.slots_started = 0  # slots whose start began (a refill past the last run's demand is counted too)
        # the other images' sub-pools, least recently asked for first; the gate their starts share
        self._images: collections.OrderedDict[str, Pool] = collections.OrderedDict()
        self._images_lock = threading.Lock()
        self._image_gate = self.start_gate or threading.Semaphore(self.parallel)
        self._threads = [
            threading.Thread(target=self._fill, name=f"toolcage-pool-fill-{i}", daemon=True)
            for i in range(self.parallel)
        ]
        if parent is None:
            _POOLS.add(self)
            telemetry.watch_pool(self)  # its depth (and its images'), while an application's meter asks
        for t in self._threads:
            t.start()

    # other images --------------------------------------------------------------------------
    def for_image(self, image: str | None) -> Pool:
        """The pool whose slots run ``image``: this one for its own image (or None), else that image's
        sub-pool, made on first use (counted as asked for now: it is the most recently used)."""
        if image is None or image == self.image:
            return self
        if not isinstance(image, str) or not image:
            raise UsageError("image must be an image reference (name[:tag] or an image id)")
        if self.parent is not None:
            return self.parent.for_image(image)
        with self._images_lock:
            if self._closed:
                raise UsageError("the pool is closed")
            for ended in [ref for ref, p in self._images.items() if p._closed]:
                del self._images[ended]  # (their fillers have returned)
            sub = self._images.get(image)
            if sub is not None and not sub._touch(self.per_image):
                sub = None  # it ended, idle: a new one
            if sub is None:
                sub = self._images[image] = self._for_image(image)
            self._images.move_to_end(image)
            if self.per_image:
                self._bound(sub)
            return sub

    def _for_image(self, image: str) -> Pool:
        sub = Pool.__new__(Pool)
        sub.start_gate = self._image_gate  # shared: a burst over many images starts `parallel` at a time
        sub.options = dataclasses.replace(self.options, image=image)
        sub.size, sub.idle_s, sub.per_image, sub.max_warm = max(self.per_image, 1), self.idle_s, 0, 0
        sub.parallel = self.parallel
        sub._setup(self.id, keep=self.per_image, parent=self)  # the pool's id: its slots carry its label
        return sub

    def _touch(self, keep: int) -> bool:
        """A sub-pool asked for: False if it has ended (idle), else it is now in use, and keeps ``keep``
        warm again (an eviction may have cut it)."""
        with self._cond:
            if self._closed:
                return False
            self._last_used = time.monotonic()
            self._keep = keep
            return True

    def warm(self, image: str | None = None, count: int = 1) -> None:
        """Start ``count`` slots of ``image`` ahead of the runs that will take them (each taken once, not
        refilled), within ``max_warm`` across images: the least recently asked-for image's waiting slots
        are evicted to make room. The pool's own image (None) is kept at ``size`` already."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise UsageError("warm count must be a non-negative integer")
        sub = self.for_image(image)
        if sub is self:
            return
        with self._images_lock:
            with sub._cond:
                sub._extra += count
                sub._last_used = time.monotonic()
            self._bound(sub)
            with sub._cond:
                sub._changed()

    def _bound(self, keep: Pool) -> None:
        """Held under _images_lock: at most ``max_warm`` slots asked for ahead across the sub-pools;
        beyond, the least recently asked-for image's are evicted (``keep``'s last, and only down to what
        fits). Slots a run waits for are not warm: never evicted."""

        def asked(p: Pool) -> int:
            return p._keep + p._extra

        over = sum(asked(p) for p in self._images.values()) - self.max_warm
        for p in [*(p for p in self._images.values() if p is not keep), keep]:
            if over <= 0:
                break
            with p._cond:
                cut = min(over, asked(p))
                over -= cut
                from_extra = min(cut, p._extra)
                p._extra -= from_extra
                p._keep -= cut - from_extra
                evicted: list[Slot] = []
                while len(p._ready) > asked(p) + p._waiting:
                    evicted.append(p._ready.popleft())  # the oldest: the least life left
                p._changed()
            for slot in evicted:
                p._retire(slot, "evicted")

    def images(self) -> dict[str, int]:
        """The other images' sub-pools now, and how many slots of each wait ready."""
        with self._images_lock:
            subs = list(self._images.items())
        return {image: sub.ready() for image, sub in subs if not sub._closed}

    def _idle_end(self, now: float) -> bool:
        """Held under the lock: a sub-pool nobody asked anything of during idle_s, with nothing waiting
        or starting, ends (its fillers return); the next ask makes a new one."""
        if self.parent is None or self._ready or self._starting or self._waiting or self._handoffs:
            return False
        if self._keep + self._extra > 0 or now - self._last_used < self.idle_s:
            return False
        self._closed = True
        return True

    # the caller's side -----------------------------------------------------------------
    def sandbox(
        self,
        *,
        secrets: Mapping[str, str] | None = None,
        image: str | None = None,
        resume: str | os.PathLike[str] | IO[bytes] | None = None,
        snapshot_key: bytes | None = None,
    ) -> Any:
        """A Sandbox that adopts one slot when started (``with pool.sandbox() as sb:``); ``image``: a slot
        of that image (default: the pool's own), from its sub-pool (see the module's note); ``resume``: a
        snapshot (``sb.snapshot()``) whose files fill the slot after adoption, checked before a slot is taken."""
        from toolcage.sandbox import Sandbox

        return Sandbox(pool=self.for_image(image), secrets=secrets, resume=resume, snapshot_key=snapshot_key)

    def ready(self, image: str | None = None) -> int:
        """How many slots wait, started and answering (of ``image``: default the pool's own)."""
        pool = self.for_image(image) if image is not None else self
        with pool._cond:
            return len(pool._ready)

    def wait_ready(self, count: int | None = None, timeout: float = 60.0, image: str | None = None) -> bool:
        """Block until ``count`` (default: ``size``; of another ``image``: what was asked for it with
        ``per_image`` and ``warm()``) slots wait; False on timeout. Raises what stops slots from starting
        (the image missing, Docker down)."""
        if image is not None and (pool := self.for_image(image)) is not self:
            return pool.wait_ready(count, timeout)
        want = self.wanted_ready(count)
        until = time.monotonic() + timeout
        with self._cond:
            while (done := self.ready_for(want)) is None:
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.5))
            return done

    def wanted_ready(self, count: int | None) -> int:
        """(Internal: wait_ready's first step, and AsyncPool's.) How many slots a wait_ready waits for
        (asking is using: a pool gone cold refills; counted once, from now: counted on every wake-up,
        slots made meanwhile would outlive the pool's use)."""
        with self._cond:
            asked = self._keep + self._extra  # a sub-pool's: what per_image and warm() asked for
            want = asked if count is None else min(count, max(asked, self.size if self.parent is None else 0))
            self._last_used = time.monotonic()
            self._changed()
        return want

    def ready_for(self, want: int) -> bool | None:
        """(Internal: as wanted_ready.) Has a wait for ``want`` ready slots ended (True: they wait;
        False: the pool is closed), or None: not yet. Raises what stops slots from starting."""
        with self._cond:
            if len(self._ready) >= want:
                return True
            if self._error is not None and self._failures >= 2:
                raise self._error
            return False if self._closed else None

    def watch(self, watcher: Callable[[], None], on: bool = True) -> None:
        """(Internal: AsyncPool.wait_ready's wake-up.) ``watcher()`` is called (under the lock, from any
        thread; it must not block) on every change from now on (``on=False``: no longer)."""
        with self._cond:
            if on:
                self._watchers.append(watcher)
            else:
                self._watchers.remove(watcher)

    def take(self, timeout: float = READY_WAIT_S * 2) -> Slot:
        """The oldest waiting slot, for one run; waits for one to start when none waits."""
        until = time.monotonic() + timeout
        with self._cond:
            self._last_used = time.monotonic()
            self._waiting += 1
            self._cond.notify_all()
            try:
                while True:
                    if (stop := self._why_no_slot()) is not None:
                        raise stop
                    slot = self._pop_ready()
                    if slot is not None:
                        self._changed()  # a filler starts its replacement
                        return slot
                    if (stop := self._why_no_slot(starting=True)) is not None:
                        raise stop
                    left = until - time.monotonic()
                    if left <= 0:
                        raise ToolcageError("no pooled sandbox became ready in time")
                    self._cond.wait(min(left, 0.5))
            finally:
                self._waiting -= 1

    def _why_no_slot(self, starting: bool = False) -> ToolcageError | None:
        """Held under the lock: why a taker gets no slot (the pool closed; with ``starting``: what made
        the last start fail, none being under way), or None."""
        if self._closed:
            return UsageError("the pool is closed")
        if starting and self._error is not None and self._starting == 0 and self._failures >= 1:
            return self._error
        return None

    def _pop_ready(self) -> Slot | None:
        """Held under the lock: the oldest waiting slot that can still give a whole run, counted as taken."""
        while self._ready and not self._has_a_run_left(self._ready[0]):
            self._retire(self._ready.popleft(), "expired")
        if not self._ready:
            return None
        self.adopted += 1
        self._last_taken = time.monotonic()
        slot = self._ready.popleft()
        slot.ahead = self._extra > 0
        if slot.ahead:  # one started ahead (warm()) is taken: not refilled
            self._extra -= 1
        return slot

    # the async twin's side (toolcage.aio: AsyncPool, AsyncSandbox(pool=...)), no thread waits for them.
    # Internal, not for users: wanted_ready, ready_for and watch above; take_later, forget and give_back here.
    def take_later(self, handoff: Handoff) -> None:
        """Hand ``handoff`` the oldest slot when there is one (now, if one waits), or the error that
        stops slots from starting; meanwhile fillers count it as a taker waiting."""
        with self._cond:
            self._last_used = time.monotonic()
            self._handoffs.append(handoff)
            self._waiting += 1
            self._changed()

    def forget(self, handoff: Handoff) -> bool:
        """An async taker gave up (timeout, cancelled): True if it was still waiting, False if it was
        handed something already (a slot on its way comes back through give_back)."""
        with self._cond:
            try:
                self._handoffs.remove(handoff)
            except ValueError:
                return False
            self._waiting -= 1
            return True

    def give_back(self, slot: Slot) -> None:
        """A slot handed to an async taker who was gone by the time it arrived: first in line again."""
        with self._cond:
            if not self._closed:
                self.adopted -= 1
                self._extra += slot.ahead  # as it was before the hand-off
                self._ready.appendleft(slot)
                self._changed()
                return
        self._retire(slot, "closed")

    def _changed(self) -> None:
        """Held under the lock: slots, errors or demand changed. Wakes threads (fillers, takers), hands
        waiting slots to async takers, oldest first, and tells the watchers."""
        self._cond.notify_all()
        while self._handoffs:
            slot = self._pop_ready()
            if slot is None:
                break
            handoff = self._handoffs.popleft()
            self._waiting -= 1
            if not handoff(slot):  # its event loop is gone: the slot goes to the next taker
                self.adopted -= 1
                self._extra += slot.ahead
                self._ready.appendleft(slot)
        if self._handoffs and (stop := self._why_no_slot(starting=True)) is not None:
            while self._handoffs:
                self._waiting -= 1
                self._handoffs.popleft()(stop)
        for watcher in list(self._watchers):
            watcher()

    def _has_a_run_left(self, slot: Slot) -> bool:
        """Can the slot still give a whole run_s from now? Its container, worker and proxy stop at the
        deadline fixed when it was made (idle_s + run_s ahead); one that waited past its idle time (its
        expiry late behind busy fillers) would otherwise cut its run short of what a fresh sandbox gets."""
        return slot.deadline - time.time() >= self.policy.timeouts.run_s + ADOPT_MARGIN_S

    # filling -----------------------------------------------------------------------------
    def _wanted(self, now: float) -> bool:
        """Should one more slot start? Held under the lock."""
        if self._closed:
            return False
        have = len(self._ready) + self._starting
        in_use = now - self._last_used < self.idle_s or self._waiting > 0
        return in_use and have < self._keep + self._extra + max(self._waiting - len(self._ready), 0)

    def _fill(self) -> None:
        while True:
            with self._cond:
                while True:
                    now = time.monotonic()
                    if self._wanted(now):
                        later = self._last_taken + REFILL_DELAY_S - now
                        if later <= 0 or self._waiting > len(self._ready):  # nobody waits for it: no hurry
                            break
                        self._cond.wait(later)
                        continue
                    if self._closed or self._idle_end(now):
                        return
                    self._expire_idle()
                    self._cond.wait(min(self.idle_s / 4, 1.0))
                self._starting += 1
                self.slots_started += 1
            slot: Slot | None = None
            try:
                with self.start_gate or contextlib.nullcontext():
                    slot = self._make_slot()
            except Exception as exc:
                err = exc if isinstance(exc, ToolcageError) else ToolcageError(f"{type(exc).__name__}: {exc}")
                self.log.warning("pool.slot_failed", error=err.message, status=err.status)
                with self._cond:
                    self._starting -= 1
                    self._error, self._failures = err, self._failures + 1
                    pause = min(FAIL_BACKOFF_S[0] * 2 ** (self._failures - 1), FAIL_BACKOFF_S[1])
                    self._changed()
                    self._cond.wait(pause)
                continue
            with self._cond:
                self._starting -= 1
                self._error, self._failures = None, 0
                if self._closed:
                    closed = True
                else:
                    closed = False
                    self._ready.append(slot)
                    self._changed()
            if closed:
                self._retire(slot, "closed")

    def _expire_idle(self) -> None:
        """Held under the lock: slots that waited idle_s are removed (refilled only while the pool is used)."""
        now = time.monotonic()
        while self._ready and now - self._ready[0].created >= self.idle_s:
            self._retire(self._ready.popleft(), "idle")

    def _make_slot(self) -> Slot:
        run = Run(self.options, pool=self.id)
        run_id, name, log = run.run_id, run.name, run.log
        made: list[Slot] = []

        def redact(rec: Any) -> Any:  # the proxy's records, with the adopting run's secrets (slot.redact)
            return made[0].redact(rec) if made else rec

        backend = run.make_backend(redact=redact)
        slot = Slot(self, run, backend)
        made.append(slot)
        slot.image_id = backend.image_id()
        session = Session(
            max_line=run.max_line,
            on_stderr_line=slot.stderr_line,
            on_broken=slot.broken,
            redact=slot.redact,
        )
        slot.session = run.session = session
        # the slot's longest life: idle_s waiting, then one run; the run's own deadline comes at adoption
        slot.deadline = time.time() + self.idle_s + self.policy.timeouts.run_s + SLOT_GRACE_S
        if self.audit is not None:  # on disk before the container exists (off any caller's path)
            self.audit.event(
                "pool.slot_created", run_id=run_id, name=name, pool=self.id, tool=self.tool, image=self.image,
                image_id=slot.image_id, policy=self.policy.name, policy_sha256=self.policy.sha256(),
                workspace=str(self.workspace) if self.workspace else None, owner=ownership.owner()[0],
                network=self.policy.network.mode,
            )  # fmt: skip
        try:
            run.launch(
                session.parser, slot.deadline, started_at=slot.created_at, pool=self.id,
                extra_env={contract.ENV_POOLED: self._pooled_env},  # the worker readies what adoption needs
            )  # fmt: skip
            until = time.monotonic() + READY_WAIT_S + timing.GRACE_S
            answer = session.request(contract.PING, None, until)
            if isinstance(answer, Ended) or answer.get("result") != "pong":
                tail = session.parser.stderr_tail(500).strip()
                raise ToolcageError(f"a pooled sandbox did not answer its first ping: {tail or answer}")
            session.request(contract.USAGE, None, until)  # loads what the run's close asks for, now
        except BaseException:
            self._retire(slot, "failed", now=True)
            raise
        took_ms = round((time.monotonic() - slot.created) * 1e3)
        log.info("pool.slot_ready", container_id=backend.container_id, ms=took_ms)
        return slot

    # removal ---------------------------------------------------------------------------------
    def _retire(self, slot: Slot, why: str, now: bool = False) -> None:
        """Remove a slot: an adopted one when its run closes (``used``), or one nobody took. In the
        background (the process's one remover, ``toolcage.lifecycle.removal``) unless ``now``."""
        if slot.retired:
            return
        slot.retired = True
        if why != "used" and self.audit is not None:
            self.audit.event_later("pool.slot_removed", run_id=slot.run_id, name=slot.name, pool=self.id, reason=why)
        if why != "used":  # a used slot's worker saw its stdin close and is exiting by itself
            slot.backend.kill()  # at once: the worker stops even if its removal waits
        if now:
            self._remove(slot)
        else:
            removal.schedule(functools.partial(self._remove, slot))

    def _remove(self, slot: Slot) -> None:
        if slot.session is not None:
            slot.session.close_input()
        try:
            slot.backend.remove(False)
        except ToolcageError as exc:
            self.log.warning("pool.remove_failed", run_id=slot.run_id, error=exc.message)
        finally:
            if slot.session is not None:
                slot.session.close()

    def close(self) -> None:
        """Remove every waiting slot and stop refilling; waits for the removals. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            waiting = list(self._ready)
            self._ready.clear()
            self._changed()  # async takers still waiting learn that the pool is closed
        with self._images_lock:  # (for_image makes none once it sees the pool closed)
            subs = list(self._images.values())
            self._images.clear()
        for slot in waiting:
            self._retire(slot, "closed")
        for sub in subs:
            sub.close()
        for t in self._threads:
            t.join(READY_WAIT_S + 5)  # a slot mid-start is retired by its filler
        removal.wait_removed()
        if self.audit is not None:
            self.audit.drain()
        _POOLS.discard(self)
        telemetry.unwatch_pool(self)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Pool"]
