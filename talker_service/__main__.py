"""``python -m talker_service``: the talker stage process."""

from __future__ import annotations

from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.stage_main import run_stage_process

from .server import TalkerServicer, add_engine_arguments, engine_config_from_args

DEFAULT_PORT = 50052


def main(argv: list[str] | None = None) -> None:
    run_stage_process(
        stage="talker",
        description="qwen3-tts talker stage (talker LM + code predictor, continuous batching)",
        default_port=DEFAULT_PORT,
        add_arguments=add_engine_arguments,
        build_servicer=lambda args: TalkerServicer(args.model, engine_config_from_args(args)),
        add_to_server=stages_pb2_grpc.add_TalkerServicer_to_server,
        pb2_module=stages_pb2,
        service="Talker",
        argv=argv,
    )


if __name__ == "__main__":
    main()
