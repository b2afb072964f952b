"""Random lives of pods and nodes on a Kubernetes cluster scheduled by gpuloom: pods are
made, placed by the real placement cycle, bound by kube-scheduler where the extender
lets them, end, are deleted, preempted, their nodes go NotReady and come back. After
each step the watcher's round runs and its decisions are folded: the fold must apply
every one of them (none voided), no GPU is held by two jobs, and the state keeps its
invariants."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from fixtures.checks import check_invariants
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.kube.extender import bind_pod, filter_pod
from gpuloom.kube.nodes import KubeNode, kube_name
from gpuloom.kube.pods import Pod, PodPhase
from gpuloom.kube.watch import Annotate, Delete, Evict, PodsSeen
from gpuloom.state.lifecycle import ON_NODE

from .kubeworld import World, kube_nodes, kube_pod, node_obj, uid_of

NODES = ("node-a.example", "node-b")


@dataclass
class Cluster:
    """The Kubernetes side: its Nodes' readiness and its pods, as the API holds them."""

    world: World = field(default_factory=World)
    ready: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(NODES, True))
    pods: dict[str, Pod] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    made: int = 0

    def nodes(self) -> dict[str, KubeNode]:
        return kube_nodes(*(node_obj(n, 2, ready=self.ready[n]) for n in NODES))

    def seen(self) -> PodsSeen:
        return PodsSeen(dict(self.pods), frozenset(self.deleted), self.world.now)

    def gone(self, uid: str) -> None:
        self.pods.pop(uid, None)
        self.deleted.add(uid)

    def round(self) -> None:
        """The watcher's round, folded; its actions carried out by the API server."""
        for done in [u for u, p in self.pods.items() if p.deleting]:
            self.gone(done)  # the kubelet (or the API) is done with what was deleting
        found = self.world.round(self.nodes(), self.seen())
        for action in found.actions:
            uid = next((u for u, p in self.pods.items() if p.name == action.name), None)
            if uid is None:
                continue
            pod = self.pods[uid]
            if isinstance(action, Annotate):
                notes = {**pod.annotations, **dict(action.annotations)}
                self.pods[uid] = replace(pod, annotations=notes)
            elif isinstance(action, Evict | Delete):
                self.pods[uid] = replace(pod, deleting=True)

    # --- steps ------------------------------------------------------------------------

    def make_pod(self, gpus: int) -> None:
        self.made += 1
        pod = kube_pod(f"p{self.made}", uid_of(self.made), gpus)
        self.pods[pod.uid] = pod
        self.schedule(pod)

    def schedule(self, pod: Pod) -> None:
        """kube-scheduler's filter (which submits a new pod) and, where one node passes,
        its bind."""
        w = self.world
        offered = [n for n in NODES if self.ready[n]]
        answer = filter_pod(w.state, pod, offered, w.defaults, w.reasons)
        if answer.submit is not None:
            w.write(answer.submit)
        if not answer.passed:
            return
        [host] = answer.passed
        bound = bind_pod(w.state, pod, host)
        assert bound.error is None, bound.error
        notes = {**pod.annotations, **bound.annotations}
        self.pods[pod.uid] = replace(pod, node_name=host, annotations=notes)

    def place(self) -> None:
        self.world.queue()
        self.world.place()

    def bind_all(self) -> None:
        for pod in list(self.pods.values()):
            if not pod.node_name and not pod.deleting:
                self.schedule(pod)

    def end(self, pick: int, succeeded: bool) -> None:
        bound = sorted(u for u, p in self.pods.items() if p.node_name and not p.ended)
        if bound:
            uid = bound[pick % len(bound)]
            phase: PodPhase = "Succeeded" if succeeded else "Failed"
            self.pods[uid] = replace(self.pods[uid], phase=phase, exit_code=0 if succeeded else 2)

    def delete(self, pick: int) -> None:
        if self.pods:
            self.gone(sorted(self.pods)[pick % len(self.pods)])

    def flip_node(self, pick: int) -> None:
        """A node turns NotReady, or Ready again, once the pods are settled: a pod that
        ends or goes in the very round its node is lost is test_watch.py's
        `test_a_pod_that_ended_as_its_node_went_not_ready_keeps_its_outcome` (a bug)."""
        for _ in range(5):
            if not any(p.deleting for p in self.pods.values()):
                break
            self.round()
        name = NODES[pick % len(NODES)]
        self.ready[name] = not self.ready[name]

    def preempt(self, pick: int) -> None:
        state = self.world.state
        on_node = sorted(j for j, job in state.jobs.items() if job.phase in ON_NODE)
        others = sorted(state.jobs)
        if not on_node or len(others) < 2:
            return
        victim = state.jobs[on_node[pick % len(on_node)]]
        if victim.preempted_by is not None:
            return
        by = next(j for j in others if j != victim.job_id)
        self.world.preempt(victim, by)

    # --- what must hold ---------------------------------------------------------------

    def check(self) -> None:
        state = self.world.state
        self.world.check()
        check_invariants(state, len(self.world.log))
        for node in state.nodes.values():
            for gpu in node.gpus.values():
                if gpu.pool == "physical":
                    assert len(gpu.holders) <= 1, (node.name, gpu.index, gpu.holders)
                assert gpu.milli_used <= MILLI_PER_GPU
        # a replica reported started runs in a pod bound where it was placed
        for pod in self.pods.values():
            job_id = state.idempotency_keys.get(pod.job_key)
            job = state.jobs.get(job_id) if job_id else None
            if job is not None and job.phase in ON_NODE and 0 in job.started_replicas:
                assert pod.node_name == kube_name(job.replicas[0].host), (pod, job.replicas)


#: Each step and how often it comes (placing and binding most: that is what the
#: others need to find something to end, delete or preempt).
KINDS = ["make"] * 3 + ["cycle"] * 4 + ["place", "bind", "succeed", "fail", "delete", "flip"]
KINDS += ["succeed", "delete", "preempt", "preempt"]
STEPS = st.tuples(st.sampled_from(KINDS), st.integers(0, 9))


def step(cluster: Cluster, kind: str, arg: int) -> None:
    if kind == "make":
        cluster.make_pod(1 + arg % 3)
    elif kind == "cycle":  # the placement service, then kube-scheduler, both at once
        cluster.place()
        cluster.round()
        cluster.bind_all()
    elif kind == "place":
        cluster.place()
    elif kind == "bind":
        cluster.bind_all()
    elif kind in ("succeed", "fail"):
        cluster.end(arg, kind == "succeed")
    elif kind == "delete":
        cluster.delete(arg)
    elif kind == "flip":
        cluster.flip_node(arg)
    else:
        cluster.preempt(arg)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(STEPS, min_size=1, max_size=25))
def test_every_decision_of_the_watcher_is_folded_and_no_gpu_is_held_twice(
    steps: list[tuple[str, int]],
) -> None:
    cluster = Cluster()
    cluster.world.register(*(node_obj(n, 2) for n in NODES))
    for kind, arg in steps:
        step(cluster, kind, arg)
        cluster.round()
        cluster.check()
    # and once nothing changes, the watcher has nothing more to say
    cluster.round()
    cluster.round()
    cluster.check()
