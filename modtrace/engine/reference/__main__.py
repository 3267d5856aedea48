"""``python -m modtrace.engine.reference``: serve the reference engine on a local port.

Prints ``listening on http://HOST:PORT`` once the port is bound (``--port 0``
picks a free one), then serves until interrupted. With ``--export``, spans
go where :func:`modtrace.export.configure` sends them (``OTEL_*`` and
``MODTRACE_*`` variables).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .engine import EngineConfig, ReferenceEngine
from .server import bind, create_app


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server; the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m modtrace.engine.reference",
        description="Serve the modtrace reference engine (tiny random Qwen2.5-Omni on the CPU).",
    )
    defaults = EngineConfig()
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (default)")
    parser.add_argument("--model-name", default=defaults.model_name, help="served model name")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the weights")
    parser.add_argument("--device", default=defaults.device, help="cpu, or cuda")
    parser.add_argument("--max-batch", type=int, default=defaults.max_batch)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument(
        "--allow-fault-injection",
        action="store_true",
        help="honour the x-reference-engine-fault header (tests only)",
    )
    parser.add_argument("--export", action="store_true", help="export spans (modtrace.export)")
    parser.add_argument("--log-level", default="warning", help="uvicorn log level")
    args = parser.parse_args(argv)

    import uvicorn

    if args.export:
        from ...export import configure

        configure(service_name="modtrace-reference-engine")
    config = EngineConfig(
        model_name=args.model_name,
        seed=args.seed,
        device=args.device,
        max_batch=args.max_batch,
        threads=args.threads,
        allow_fault_injection=args.allow_fault_injection,
    )
    app = create_app(ReferenceEngine(config))
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level=args.log_level, lifespan="on", access_log=False)
    )
    server.run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
