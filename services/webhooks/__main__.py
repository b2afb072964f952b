"""Composition root of the webhooks process: the log's events POSTed to receivers.

It runs apart from the gateway, under its own bus identity (`webhooks`: it may publish
WebhookDisabled, its dead letters, and use its durable consumer `webhooks`; nothing
else), so that what a hostile receiver costs (connections, memory, time) lands here,
never on the API every user needs. Its pieces: its own fold of the log (`fold`), the
outbox that writes each event's deliveries before acknowledging it (`outbox`), and the
sender that delivers them (`sender`); the tables are the gateway's too, which shows
them (`GET /v1/webhooks/{id}/deliveries`).
"""

from __future__ import annotations

import asyncio
import logging

from gpuloom.auth.visibility import Owners
from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.runtime.service import run_service, snapshotter
from gpuloom.store.owners import read_model_owner
from gpuloom.store.session import make_engine, make_sessionmaker
from gpuloom.tasks import cancel_and_wait
from gpuloom.webhooks.sealing import load_sealer
from services.webhooks.disable import disabler
from services.webhooks.fold import SERVICE, Fold
from services.webhooks.outbox import Outbox
from services.webhooks.sender import Sender

log = logging.getLogger(__name__)


async def main(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    """Fold the log; once the fold holds the log as it was at start (the webhooks
    registered so far are known), run the outbox and the sender until `stop`."""
    engine = make_engine(settings.database_url)
    sessions = make_sessionmaker(engine)
    fold = Fold(bus, snapshotter(settings, bus, SERVICE))
    folding = asyncio.create_task(fold.run(stop))
    tasks = [folding]
    try:
        await _until(fold.caught_up, folding, stop)
        if stop.is_set():
            return
        disable = disabler(bus, lambda: fold.state, settings.publish_timeout_s)
        sender = Sender(
            settings,
            sessions,
            lambda: fold.state,
            lambda: outbox.covered_seq,
            load_sealer(settings),
            disable,
        )
        outbox = Outbox(
            bus,
            fold,
            sessions,
            Owners(lambda: fold.state, read_model_owner(sessions)),
            lambda: fold.state.accounts,
            sender.notify,
            disable,
            max_backlog=settings.webhook_max_backlog,
            backlog_grace_s=settings.webhook_backlog_grace_s,
        )
        tasks += [asyncio.create_task(outbox.run(stop)), asyncio.create_task(sender.run(stop))]
        await _until(stop, folding, stop)
    finally:
        stop.set()
        await asyncio.wait(tasks, timeout=15)  # the fold's last snapshot
        await cancel_and_wait(*tasks)
        await engine.dispose()


async def _until(event: asyncio.Event, folding: asyncio.Task[None], stop: asyncio.Event) -> None:
    """Wait for `event`. The fold ending first, unless told to stop, raises what it
    raised: the process ends and its supervisor starts it again."""
    waiting = asyncio.create_task(event.wait())
    try:
        await asyncio.wait({waiting, folding}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(waiting)
    if folding.done() and not event.is_set() and not stop.is_set():
        folding.result()
        raise RuntimeError("the webhooks' fold of the log ended")


def entrypoint(argv: list[str] | None = None) -> None:
    run_service(SERVICE, main)


if __name__ == "__main__":
    entrypoint()
