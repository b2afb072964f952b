"""kube-scheduler's three extender verbs over HTTP (`k8s.io/kube-scheduler/extender/v1`):
`POST /scheduler/filter`, `/scheduler/prioritize`, `/scheduler/bind`.

These handlers only translate: the answers are `gpuloom.kube.extender`'s, on the state
the extender folded. A request that is not what kube-scheduler sends (a body too large,
not JSON, no pod) gets a 400 and an `Error` in kube-scheduler's own shape; a bad
annotation is the pod's problem, said in its FailedScheduling event and an event of
ours, never an error of the extender's.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from gpuloom.events import Decision, intents
from gpuloom.kube.extender import (
    FilterAnswer,
    Reasons,
    bind_pod,
    filter_pod,
    placed_later,
    pod_job,
    prioritize_pod,
)
from gpuloom.kube.pods import Pod, PodDefaults, read_pod
from gpuloom.kubeapi import ApiError, Conflict, KubeClient, Unreachable
from gpuloom.queueing.classes import classes, default_class
from gpuloom.runtime.reactor import Reactor
from gpuloom.state.lifecycle import ON_NODE
from gpuloom.telemetry.metrics import EXTENDER_VERB_SECONDS as VERB_SECONDS
from services.extender.pods import PodMemory

log = logging.getLogger(__name__)

#: The largest request body taken: a filter with the whole NodeList of a 5,000-node
#: cluster (nodeCacheCapable: false) is about this; with node names only it is small.
BODY_MOST = 64 * 1024 * 1024
#: Events recorded on pods per second at most (the pods' reasons, when they change).
EVENTS_PER_S = 20.0
#: Seconds a filter waits for this fold to reach a placement the pod already names.
CATCH_UP_S = 1.0
#: Seconds a new pod's first filter waits for gpuloom to place it (kube-scheduler's
#: cycle is one pod at a time: a pod that cannot be placed costs it this much once).
FIRST_WAIT_S = 0.15


@dataclass
class TokenBucket:
    """`rate` a second, `burst` at once: the extender's budget of a shared resource."""

    rate: float
    burst: float
    tokens: float = 0.0
    at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass
class Extender:
    """What the verbs share: the folded state, the API, the pods in mind."""

    reactor: Reactor
    kube: KubeClient
    pods: PodMemory
    account: str
    submits: TokenBucket
    reasons: Reasons = field(default_factory=Reasons)
    #: The reason last said on each pod (an event only when it changes), bounded.
    said: dict[str, str] = field(default_factory=dict)
    events: TokenBucket = field(default_factory=lambda: TokenBucket(EVENTS_PER_S, EVENTS_PER_S))
    background: set[asyncio.Task[None]] = field(default_factory=set)

    def defaults(self) -> PodDefaults:
        state = self.reactor.state
        known = classes(state)
        return PodDefaults(
            account=self.account,
            classes=frozenset(c.name for c in known),
            default_class=default_class(state).name,
            priorities=tuple((c.name, c.priority) for c in known),
        )

    async def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        pod = read_pod(args.get("Pod") or {})
        names, shape = _node_names(args)
        if pod is None:
            return {"Error": "the pod asks for no gpuloom.io/gpu: not gpuloom's"}
        self.pods.remember(pod)
        await self._catch_up(pod)
        gang = await self.pods.gang(pod)
        answer = filter_pod(self.reactor.state, pod, names, self.defaults(), self.reasons, gang)
        if answer.submit is not None:
            answer = await self._submit(pod, answer)
            if answer.submit is not None and await self._placed_soon(pod):
                state = self.reactor.state
                answer = filter_pod(state, pod, names, self.defaults(), self.reasons, gang)
        if answer.waiting is not None:
            self._tell(pod, answer)
        return _filter_result(answer, args, shape)

    async def _placed_soon(self, pod: Pod) -> bool:
        """After a new pod's submission, wait a moment (`FIRST_WAIT_S` at most) for
        gpuloom to place it: where there is room, admission, the queue and placement
        answer within tens of milliseconds, and this first filter can then pass the
        node at once, sparing kube-scheduler a failed cycle (its preemption pass and
        status write) and the pod a second one. True once the job is placed or answered
        otherwise (ended, or queued with a reason of placement's) in this fold."""
        deadline = time.monotonic() + FIRST_WAIT_S
        while time.monotonic() < deadline:
            found, job = pod_job(self.reactor.state, pod)
            if found is not None and (job is None or job.phase in ON_NODE or job.is_final):
                return True
            await asyncio.sleep(0.005)
        return pod_job(self.reactor.state, pod)[0] is not None

    async def _catch_up(self, pod: Pod) -> None:
        """Wait (a moment at most) until this fold holds the placement the pod's
        annotations already name: the watcher annotated the pod once its own fold held
        it, and that update is what made kube-scheduler ask again now; answering from an
        older state would send the pod back to wait for the scheduler's next flush."""
        deadline = time.monotonic() + CATCH_UP_S
        while time.monotonic() < deadline and placed_later(self.reactor.state, pod):
            await asyncio.sleep(0.005)

    async def _submit(self, pod: Pod, answer: FilterAnswer) -> FilterAnswer:
        """Write the pod's job (one JobSubmitted however often it is asked: its key is the
        pod's UID) before the scheduler hears it waits; within the budget."""
        assert answer.submit is not None
        if not self.submits.take():
            why = "gpuloom is taking in many pods: this one is submitted at its next try"
            return FilterAnswer([], {n: why for n in answer.failed}, waiting=None)
        if not await self.pods.exists(pod):  # a forged pod from a local caller
            why = f"pod {pod.namespace}/{pod.name} ({pod.uid}) is not in the Kubernetes API"
            return FilterAnswer([], {n: why for n in answer.failed}, waiting=None)
        decision = Decision(answer.submit, intents.submitted(pod.job_key))
        try:
            await self.reactor.publish([decision])
        except Exception as exc:  # the log is away: kube-scheduler tries again
            why = f"gpuloom could not record the pod's job yet ({type(exc).__name__}): retrying"
            log.warning("could not submit pod %s/%s: %s", pod.namespace, pod.name, exc)
            return FilterAnswer([], {n: why for n in answer.failed}, waiting=None)
        return answer

    def _tell(self, pod: Pod, answer: FilterAnswer) -> None:
        """An event on the pod when what it waits for changed (bounded in rate)."""
        why = answer.waiting or ""
        if self.said.get(pod.uid) == why or not self.events.take():
            return
        if len(self.said) > self.pods.most:
            self.said.clear()
        self.said[pod.uid] = why
        reason = "GpuloomInvalidRequest" if answer.problem is not None else "GpuloomWaiting"
        involved = {
            "kind": "Pod",
            "metadata": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid},
        }
        task = asyncio.ensure_future(self._record(involved, reason, why))
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def _record(self, involved: dict[str, Any], reason: str, message: str) -> None:
        try:
            await self.kube.record_event(involved, reason, message[:1000])
        except (ApiError, Unreachable) as exc:
            log.info("could not record an event on a pod: %s", exc)

    async def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        pod = read_pod(args.get("Pod") or {})
        names, _ = _node_names(args)
        if pod is None:
            return [{"Host": name, "Score": 0} for name in names]
        scores = prioritize_pod(self.reactor.state, pod, names)
        return [{"Host": name, "Score": score} for name, score in scores]

    async def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        namespace = str(args.get("PodNamespace") or "")
        name, uid, node = (str(args.get(k) or "") for k in ("PodName", "PodUID", "Node"))
        if not (namespace and name and uid and node):
            return {"Error": "bind needs PodName, PodNamespace, PodUID and Node"}
        pod = await self.pods.pod(namespace, name, uid)
        if pod is None:
            return {"Error": f"pod {namespace}/{name} ({uid}) is gone"}
        answer = bind_pod(self.reactor.state, pod, node, await self.pods.gang(pod))
        if answer.error is not None:
            return {"Error": answer.error}
        try:
            if any(pod.annotations.get(k) != v for k, v in answer.annotations.items()):
                # the watcher wrote them once gpuloom placed it (that is what made
                # kube-scheduler ask again): written again only when they differ
                await self.kube.annotate_pod(namespace, name, answer.annotations)
            await self.kube.bind_pod(namespace, name, uid, node)
        except Conflict as exc:
            return {"Error": f"pod {namespace}/{name} could not be bound: {exc}"}
        except (ApiError, Unreachable) as exc:
            return {"Error": f"the Kubernetes API refused the binding: {exc}"}
        return {"Error": ""}


def _node_names(args: dict[str, Any]) -> tuple[list[str], str]:
    """The candidate nodes' names, and how they came: `NodeNames` (nodeCacheCapable) or
    a whole `Nodes` list."""
    if isinstance(args.get("NodeNames"), list):
        return [str(n) for n in args["NodeNames"]], "names"
    items = (args.get("Nodes") or {}).get("items") or []
    return [str((n.get("metadata") or {}).get("name") or "") for n in items], "nodes"


def _filter_result(answer: FilterAnswer, args: dict[str, Any], shape: str) -> dict[str, Any]:
    if shape == "names":
        return {"NodeNames": answer.passed, "FailedNodes": answer.failed, "Error": ""}
    keep = set(answer.passed)
    given = (args.get("Nodes") or {}).get("items") or []
    items = [n for n in given if (n.get("metadata") or {}).get("name") in keep]
    return {
        "Nodes": {"metadata": {}, "items": items},
        "FailedNodes": answer.failed,
        "Error": "",
    }


def app(extender: Extender) -> FastAPI:
    """The HTTP face: three POST routes and a health check."""
    web = FastAPI(title="gpuloom scheduler extender", docs_url=None, redoc_url=None)

    async def answer(
        verb: str, request: Request, handle: Callable[[dict[str, Any]], Awaitable[Any]]
    ) -> Response:
        started = time.perf_counter()
        body = await _body(request)
        if not isinstance(body, dict):
            return _json({"Error": body}, 400)
        if not extender.reactor.caught_up.is_set():
            return _json({"Error": "gpuloom's extender is still reading the log"}, 503)
        try:
            result = await handle(body)
        except Exception as exc:  # never a crash: kube-scheduler sees the error and retries
            log.exception("extender %s failed", verb)
            result = {"Error": f"gpuloom's extender failed: {type(exc).__name__}"}
        VERB_SECONDS.labels(verb).observe(time.perf_counter() - started)
        return _json(result, 200)

    @web.post("/scheduler/filter")
    async def filter_verb(request: Request) -> Response:
        return await answer("filter", request, extender.filter)

    @web.post("/scheduler/prioritize")
    async def prioritize_verb(request: Request) -> Response:
        return await answer("prioritize", request, extender.prioritize)

    @web.post("/scheduler/bind")
    async def bind_verb(request: Request) -> Response:
        return await answer("bind", request, extender.bind)

    @web.get("/healthz")
    async def healthz() -> Response:
        ready = extender.reactor.caught_up.is_set()
        return _json({"ready": ready}, 200 if ready else 503)

    return web


async def _body(request: Request) -> dict[str, Any] | str:
    size = 0
    chunks = []
    async for chunk in request.stream():
        size += len(chunk)
        if size > BODY_MOST:
            return f"the request body is over {BODY_MOST} bytes"
        chunks.append(chunk)
    try:
        decoded = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        return f"the request body is not JSON: {exc}"
    return decoded if isinstance(decoded, dict) else "the request body is not a JSON object"


def _json(body: Any, status: int) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")
