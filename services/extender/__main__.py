"""Composition root of the scheduler extender (docs/kubernetes.md).

One process, its own bus identity (it may publish JobSubmitted and nothing else): it
folds the log with a Reactor that decides nothing (its state is what the verbs read),
and serves kube-scheduler's filter, prioritize and bind on
`GPULOOM_EXTENDER_HOST:GPULOOM_EXTENDER_PORT`. It listens on loopback unless it is
given a certificate, a key and the CA of its clients (mutual TLS: only a
kube-scheduler with a certificate of that CA is answered); it refuses to start open to
anyone else, since a pod that reached it could bind pods.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl

import uvicorn

from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.kubeapi import KubeClient, KubeConfig
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.runtime.service import run_service, snapshotter
from services.extender.pods import PodMemory
from services.extender.verbs import Extender, TokenBucket, app

log = logging.getLogger(__name__)


class OpenToAll(ValueError):
    """The extender would listen beyond loopback without mutual TLS."""


def listening(settings: Settings) -> dict[str, object]:
    """uvicorn's listener options: loopback, or mutual TLS."""
    tls = (settings.extender_tls_cert, settings.extender_tls_key, settings.extender_tls_client_ca)
    if any(tls) and not all(tls):
        raise OpenToAll(
            "mutual TLS needs GPULOOM_EXTENDER_TLS_CERT, _TLS_KEY and _TLS_CLIENT_CA together"
        )
    options: dict[str, object] = {"host": settings.extender_host, "port": settings.extender_port}
    if all(tls):
        options.update(
            ssl_certfile=str(settings.extender_tls_cert),
            ssl_keyfile=str(settings.extender_tls_key),
            ssl_ca_certs=str(settings.extender_tls_client_ca),
            ssl_cert_reqs=ssl.CERT_REQUIRED,
        )
        return options
    if not _loopback(settings.extender_host):
        raise OpenToAll(
            f"the extender would listen on {settings.extender_host} without mutual TLS: any "
            "pod could then bind pods; listen on 127.0.0.1, or set GPULOOM_EXTENDER_TLS_*"
        )
    return options


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def kube_config(settings: Settings) -> KubeConfig:
    if settings.kubeconfig is not None:
        return KubeConfig.load(settings.kubeconfig)
    return KubeConfig.in_cluster()


async def main(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    options = listening(settings)
    snapshots = snapshotter(settings, bus, "extender")
    reactor = Reactor(bus, "extender", pure(lambda state: []), snapshots=snapshots)
    async with KubeClient(kube_config(settings), user_agent="gpuloom-extender") as kube:
        rate = settings.extender_submits_per_s
        extender = Extender(
            reactor,
            kube,
            PodMemory(kube, settings.extender_pods_kept),
            settings.kube_default_account,
            TokenBucket(rate, rate),
        )
        config = uvicorn.Config(
            app(extender),
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=2,
            **options,  # type: ignore[arg-type]
        )
        server = uvicorn.Server(config)
        serving = asyncio.ensure_future(server.serve())
        folding = asyncio.ensure_future(reactor.run(stop))
        stopping = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait(
                {serving, folding, stopping}, return_when=asyncio.FIRST_COMPLETED
            )
            if serving in done and not server.started:
                log.error(
                    "the extender could not listen on %s:%s", options["host"], options["port"]
                )
        finally:
            server.should_exit = True
            stop.set()
            await asyncio.gather(serving, folding, return_exceptions=True)
            stopping.cancel()


def entrypoint(argv: list[str] | None = None) -> None:
    run_service("extender", main)


if __name__ == "__main__":
    entrypoint()
