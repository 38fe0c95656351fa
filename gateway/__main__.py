"""``python -m gateway``: the public API process: gRPC (default port 50051) and, on the same event
loop, the OpenAI-compatible HTTP API with the playground (default port 8000, ``--http-port 0``
disables it).

Example::

    python -m gateway --talker-targets localhost:50052 --decoder-targets localhost:50053 \\
        --speaker-targets localhost:50054 --voices-dir /var/lib/qwen3tts/voices

Several models behind one gateway (one decoder pool)::

    python -m gateway --decoder-targets localhost:50053 \\
        --models "design: talker=localhost:50052; base: talker=localhost:50055 speaker=localhost:50054"
"""

from __future__ import annotations

import asyncio

from tts_common.logging_setup import setup_logging
from tts_common.serving.lifecycle import serve
from tts_common.serving.server import channel_options

from .config import FLAGS, STAGE, gateway_config_from_args
from .core import Gateway
from .transports.grpc_api import SERVICE_NAME, GatewayServicer, server_setup


def main(argv: list[str] | None = None) -> None:
    parser = FLAGS.parser()
    args = parser.parse_args(argv)
    try:
        config = gateway_config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    server_config = FLAGS.server_config(args)
    setup_logging(server_config.log_level, stage=STAGE)

    async def run() -> None:
        gateway = Gateway.from_config(config, channel_options(server_config))
        add_servicers, build_kwargs = server_setup(GatewayServicer(gateway), config)
        companions = []
        if config.http_port:
            from .transports.http import HttpServer  # FastAPI and uvicorn load only when the API is on

            host = config.http_host if config.http_host is not None else server_config.host
            companions.append(HttpServer(gateway, config, host, config.http_port))
        await serve(
            server_config,
            add_servicers,
            [SERVICE_NAME],
            startup=gateway.start,
            shutdown=gateway.close,
            companions=companions,
            on_health=gateway.tie_readiness,
            **build_kwargs,
        )

    asyncio.run(run())


if __name__ == "__main__":
    main()
