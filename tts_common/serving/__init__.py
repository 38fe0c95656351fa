"""gRPC serving plumbing shared by every process (grpc.aio), one concern per module:

* :mod:`.config` — :class:`~.config.ServerConfig` and :class:`~.config.ProcessFlags`, the
  command line of a process (flags generated from config dataclasses by
  :mod:`tts_common.flags`);
* :mod:`.names` — service names, and the health/reflection methods that always answer;
* :mod:`.health` — :class:`~.health.ServingHealth` (``grpc.health.v1.Health``);
* :mod:`.interceptors` — refusing calls before the servicer runs (readiness, API keys);
* :mod:`.server` — :func:`~.server.build_server` (health, reflection, readiness, message
  limits, TLS), :func:`~.server.bound_port`, server and channel options;
* :mod:`.lifecycle` — :func:`~.lifecycle.serve` (startup while NOT_SERVING, ready, graceful
  stop on SIGTERM/SIGINT) and :func:`~.lifecycle.serve_until_signal`;
* :mod:`.rpc_errors` — exceptions of :mod:`tts_common.errors` (and timeouts, cancellation, ...)
  to gRPC statuses: :func:`~.rpc_errors.handle_rpc_errors`, :func:`~.rpc_errors.abort_for_exception`;
* :mod:`.request_ids` — :func:`~.request_ids.resolve_request_id`.

A process's ``__main__`` reduces to::

    server_config, args = FLAGS.parse()                  # FLAGS: a config.ProcessFlags
    setup_logging(server_config.log_level, stage=server_config.stage)

    async def main() -> None:
        servicer = TalkerServicer(...)                   # model not loaded yet
        await serve(
            server_config,
            lambda server: stages_pb2_grpc.add_TalkerServicer_to_server(servicer, server),
            [service_name(stages_pb2, "Talker")],
            startup=servicer.load,                       # runs while health says NOT_SERVING
        )

    asyncio.run(main())                                  # returns (exit 0) after SIGTERM/SIGINT

(the model stages share that as :func:`tts_common.stage_main.run_stage_process`).
"""
