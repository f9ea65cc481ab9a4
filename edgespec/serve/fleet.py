"""`edgespec serve BUNDLE --replicas N`: the verifier as a Ray Serve application.

Takes a `ServerConfig` (the limits every replica enforces) and a `FleetConfig` (replicas or
an autoscaling range, the Ray cluster, resources per replica). Guarantees:

* every replica runs the single server's state and routes (`state.load_state`,
  `server.create_app`): its own graphs, KV pool and batching worker, the same WebSocket
  protocol, bearer token and limits; Ray Serve's proxy serves them all at one host:port;
* a WebSocket session is one long request to the replica that accepted it, so it stays there
  for its life (Ray routes each new connection to the less loaded of two replicas);
* `/health` answers for the fleet: `"replicas": N` at the top level, the totals, and one
  entry per replica (sessions, rounds served, batch sizes), from the `Board` actor every
  replica reports to every `report_period` seconds;
* a replica that Ray stops on purpose (scale-down, redeploy) drains: the board sees it leave
  the running set and tells it, the replica answers the rounds already running and refuses
  the next ones with ERROR 503, and the device resyncs on another replica. A replica that
  dies is replaced by Ray; its devices reconnect and resync the same way (client side);
* a fleet with every replica full answers a new session with the single server's 503.

Ray is the optional [fleet] extra, imported only here; `edgespec serve` without `--replicas`
never imports this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from dataclasses import replace
from typing import Any

import ray
from ray import serve
from ray.exceptions import RayActorError
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from edgespec.serve.http import sessions_in_use
from edgespec.serve.server import create_app, drain, stop
from edgespec.serve.state import FleetConfig, ServerConfig, State, load_state

log = logging.getLogger("edgespec.serve")

BOARD = "edgespec-board"  # named actor, one per application
NAMESPACE = "edgespec"


# -- the board: where replicas report and /health reads ------------------------------------
@ray.remote(num_cpus=0)
class Board:
    """Latest report of every replica, and which replicas Ray is stopping (from the Serve
    controller's view of the deployment, refreshed at most every `period` seconds).
    An async actor: calls run as they arrive, none waits behind another."""

    def __init__(self, app: str, period: float) -> None:
        self.app, self.period = app, period
        self.reports: dict[str, tuple[float, dict]] = {}
        self.running: set[str] | None = None  # None: the controller could not be asked
        self.was_running: set[str] = set()  # a replica drains once it leaves the running set
        self.checked = 0.0

    async def report(self, replica: str, report: dict) -> bool:
        """Store a replica's report; True when the replica should drain."""
        self.reports[replica] = (time.monotonic(), report)
        await self._refresh()
        return self._draining(replica)

    async def forget(self, replica: str) -> None:
        self.reports.pop(replica, None)

    async def fleet(self) -> list[dict]:
        """Reports of the replicas alive now (a report older than 4 periods: gone)."""
        await self._refresh()
        now, fresh = time.monotonic(), []
        for replica, (at, report) in sorted(self.reports.items()):
            if now - at > 4 * self.period:
                continue
            fresh.append(report | {"replica": replica, "draining": self._draining(replica)})
        return fresh

    def _draining(self, replica: str) -> bool:
        # a replica still starting is not running yet either: only one that was, drains
        return (
            self.running is not None and replica in self.was_running and replica not in self.running
        )

    async def _refresh(self) -> None:
        if time.monotonic() - self.checked < self.period:
            return
        self.checked = time.monotonic()
        try:
            self.running = await _running_replicas(self.app)
            self.was_running |= self.running
        except Exception:  # an older or newer Ray without this view: no drain hints
            log.exception("cannot read the Serve controller's replica states")
            self.running = None


async def _running_replicas(app: str) -> set[str]:
    # Ray Serve has no public per-replica state; the controller's instance details (what
    # `serve status` and the dashboard show) list each replica with its state.
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    details = await asyncio.wait_for(controller.get_serve_instance_details.remote(), 5)
    deployments = details.get("applications", {}).get(app, {}).get("deployments", {})
    return {
        r["replica_id"]
        for d in deployments.values()
        for r in d.get("replicas", [])
        if r.get("state") == "RUNNING"
    }


def board(app: str, period: float) -> ray.actor.ActorHandle:
    """The application's board (created by `deploy`, found by the replicas); detached, so
    it outlives any replica (`run` removes it with the application)."""
    return Board.options(
        name=f"{BOARD}-{app}", namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote(app, period)


def replica_report(state: State) -> dict:
    return {
        "pid": os.getpid(),
        "status": "closing" if state.closing else "ok",
        "sessions": sessions_in_use(state),
        "connections": len(state.connections),
        "max_sessions": state.config.max_sessions,
        "rounds_served": state.rounds,
        **state.stats.report(),
    }


class Draining:
    """ASGI wrapper: once `draining` is set, a session waiting for its device's next
    message is ended (its handler sees a disconnect and frees the slot) and the device is
    told to reconnect (close code 1012). A round already running is not touched: its answer
    goes out before the handler waits again."""

    def __init__(self, app: Any, draining: asyncio.Event) -> None:
        self.app, self.draining = app, draining

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return await self.app(scope, receive, send)
        drained, open_ = False, False

        async def receive_or_drain() -> dict:
            nonlocal drained
            if not self.draining.is_set():
                message = asyncio.ensure_future(receive())
                drain_wait = asyncio.ensure_future(self.draining.wait())
                await asyncio.wait({message, drain_wait}, return_when=asyncio.FIRST_COMPLETED)
                drain_wait.cancel()
                if message.done():
                    return message.result()
                message.cancel()
            drained = True
            return {"type": "websocket.disconnect", "code": 1012}

        async def track(message: dict) -> None:
            nonlocal open_
            if message["type"] == "websocket.accept":
                open_ = True
            elif message["type"] == "websocket.close":
                open_ = False
            await send(message)

        await self.app(scope, receive_or_drain, track)
        if drained and open_:
            reason = "this replica is stopping: reconnect (the session resumes elsewhere)"
            await send({"type": "websocket.close", "code": 1012, "reason": reason})


# -- the deployment ------------------------------------------------------------------------
@serve.ingress()
class Verifier:
    """One replica: the single server's state and routes, plus reporting and draining."""

    def __init__(self, config: ServerConfig, app: str, report_period: float) -> None:
        # (no replica count here: changing it must scale the deployment, not replace it)
        self.config, self.report_period = config, report_period
        self.state = load_state(config)
        self.draining = asyncio.Event()
        self.replica = serve.get_replica_context().replica_tag
        self.board = board(app, report_period)
        self.reporter = asyncio.get_running_loop().create_task(self._report_loop())

    def __serve_build_asgi_app__(self) -> Draining:
        app = create_app(self.config, self.state)
        # the fleet's /health comes first; the replica's own routes stay as they are
        app.router.routes.insert(0, Route("/health", self._health))
        return Draining(app, self.draining)

    async def _report_loop(self) -> None:
        while True:
            try:
                report = self.board.report.remote(self.replica, replica_report(self.state))
                drain_now = await asyncio.wait_for(report, 5)
                if drain_now and not self.draining.is_set():
                    log.info("replica %s: stopping, draining its sessions", self.replica)
                    self.draining.set()
                    await drain(self.state)
            except Exception:  # the board restarts with the app; keep serving meanwhile
                log.exception("replica %s: report failed", self.replica)
            await asyncio.sleep(self.report_period)

    async def _health(self, request: Request) -> JSONResponse:
        # this replica's report is fresh; the others are at most one period old
        mine = replica_report(self.state)
        try:
            await asyncio.wait_for(self.board.report.remote(self.replica, mine), 5)
            replicas = await asyncio.wait_for(self.board.fleet.remote(), 5)
        except Exception:  # the board is not answering: say what this replica knows
            log.exception("replica %s: the board did not answer", self.replica)
            replicas = [mine | {"replica": self.replica, "draining": self.state.closing}]
        live = [r for r in replicas if not r["draining"]]
        m = self.state.manifest
        return JSONResponse(
            {
                "status": "ok" if live else "closing",
                "model": m.source.get("model"),
                "backbone_fingerprint": m.backbone_fingerprint,
                "replicas": len(live),
                "sessions": sum(r["sessions"] for r in replicas),
                "max_sessions": sum(r["max_sessions"] for r in live),
                "max_context": self.state.max_context,
                "rounds_served": sum(r["rounds_served"] for r in replicas),
                "max_batch": self.config.max_batch,
                "batch_window_ms": self.config.batch_window_ms,
                "per_replica": replicas,
            }
        )

    async def check_health(self) -> None:
        if not self.state.worker.thread.is_alive():
            raise RuntimeError("the model worker thread stopped")

    async def __del__(self) -> None:
        # Ray calls this once the replica's requests (its sessions) are over, or when its
        # graceful shutdown ran out of time
        self.reporter.cancel()
        await drain(self.state)
        await asyncio.to_thread(stop, self.state)
        with contextlib.suppress(Exception):  # the board went first (the app is being deleted)
            await asyncio.wait_for(self.board.forget.remote(self.replica), 5)


def application(config: ServerConfig, fleet: FleetConfig) -> serve.Application:
    """The Ray Serve application: the Verifier deployment with the fleet's sizing."""
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": fleet.cpus_per_replica},
        # each session is one ongoing request; room above max_sessions lets a full replica
        # answer 503 itself (and /health through) instead of Ray queueing the connection
        "max_ongoing_requests": config.max_sessions + 4,
        "max_queued_requests": config.max_sessions,
        "graceful_shutdown_wait_loop_s": 0.2,
        "graceful_shutdown_timeout_s": config.drain_seconds + 4 * fleet.report_period + 5,
        "health_check_period_s": 2.0,
        "health_check_timeout_s": 10.0,
    }
    if fleet.autoscale:
        target = fleet.target_sessions or max(1.0, config.max_sessions / 2)
        options["autoscaling_config"] = {
            "min_replicas": fleet.autoscale[0],
            "max_replicas": fleet.autoscale[1],
            "target_ongoing_requests": target,
            "upscale_delay_s": 5.0,
            "downscale_delay_s": 30.0,
        }
    else:
        options["num_replicas"] = fleet.replicas
    deployment = serve.deployment(name="verifier", **options)(Verifier)
    # replicas run the bundle with intra-op threads sized to their CPU share by default
    threads = config.threads or max(1, round(fleet.cpus_per_replica))
    return deployment.bind(replace(config, threads=threads), fleet.name, fleet.report_period)


# -- the command ---------------------------------------------------------------------------
RAY_DEFAULTS = {
    "RAY_SERVE_QUEUE_LENGTH_CACHE_TIMEOUT_S": "0",
    "RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S": "1",
    "RAY_SERVE_MAX_QUEUE_LENGTH_RESPONSE_DEADLINE_S": "4",
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "30",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30",
}


def connect(fleet: FleetConfig) -> bool:
    """Join `fleet.ray_address` or start a local Ray; True if this call started Ray."""
    if ray.is_initialized():
        return False
    # Ray's router caches each replica's count of ongoing requests (10 s), which misses long
    # WebSocket sessions: at 0 it asks the two replicas it picks, so a new session goes to the
    # one with fewer sessions, never to a full one while another has room. It waits 0.1 s
    # for their answers, then takes whichever answered: on a CPU saturated by decoding a busy
    # replica answers late and every session lands on the other, so it waits up to 1 s.
    # Serve kills a proxy not ready within 5 s or missing 10 s health checks, which on such
    # a CPU kills healthy proxies at start-up: 30 s. (Workers of a local Ray inherit these;
    # on a cluster, set them on `ray start`.)
    for name, value in RAY_DEFAULTS.items():
        os.environ.setdefault(name, value)
    quiet = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if fleet.ray_address:
        ray.init(address=fleet.ray_address, namespace=NAMESPACE, **quiet)
        return False
    cpus = fleet.local_cpus or max(2, int(fleet.most_replicas * fleet.cpus_per_replica + 1.5))
    ray.init(
        num_cpus=cpus,
        object_store_memory=fleet.object_store_mb << 20,
        namespace=NAMESPACE,
        **quiet,
    )
    return True


def deploy(
    config: ServerConfig, fleet: FleetConfig, host: str = "127.0.0.1", port: int = 8700
) -> None:
    """Start Serve's proxy at host:port (if Serve is not running yet) and (re)deploy the
    application; returns once its replicas are up. Redeploying with fewer replicas drains
    the ones that go."""
    for attempt in (1, 2):
        try:
            serve.start(http_options={"host": host, "port": port})
            # the board is up before the replicas look for it
            ray.get(board(fleet.name, fleet.report_period).fleet.remote())
            serve.run(application(config, fleet), name=fleet.name, route_prefix="/")
            return
        except RayActorError as e:
            # the controller replaced a proxy (or a replica) that was slow to start; Serve
            # starts a new one, so deploying again once is enough
            if attempt == 2:
                raise
            log.warning("a Serve actor died while the fleet started (%s); deploying again", e)


def run(
    config: ServerConfig,
    fleet: FleetConfig,
    host: str = "127.0.0.1",
    port: int = 8700,
    log_level: str = "info",
) -> None:
    """`edgespec serve --replicas N`: deploy, serve until SIGINT/SIGTERM, then take the
    application down (draining it) and stop the local Ray if this command started it."""
    from edgespec.bundle import load_manifest

    load_manifest(config.bundle)  # a bad bundle is refused here, not in every replica
    config = replace(config, bundle=os.path.abspath(config.bundle))  # replicas' cwd differs
    logging.basicConfig(level=log_level.upper(), format="%(message)s")
    started = connect(fleet)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # after ray.init, which sets its own
        signal.signal(sig, lambda *_: stop.set())
    try:
        deploy(config, fleet, host, port)
        log.info("edgespec fleet %r serving at http://%s:%d", fleet.name, host, port)
        while not stop.wait(0.5):  # a short wait: signals are handled between waits
            pass
        serve.delete(fleet.name)
        ray.kill(board(fleet.name, fleet.report_period))
    finally:
        if started:
            serve.shutdown()
            ray.shutdown()
