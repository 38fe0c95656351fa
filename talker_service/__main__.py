"""``python -m talker_service``: the talker stage process."""

from __future__ import annotations

from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.stage_main import run_stage_process

from .config import FLAGS, engine_config_from_args
from .engine.dtype_probe import checkpoint_talker_probe
from .server import TalkerServicer


def main(argv: list[str] | None = None) -> None:
    run_stage_process(
        flags=FLAGS,
        build_servicer=lambda model, args: TalkerServicer(model.model, engine_config_from_args(model, args)),
        add_to_server=stages_pb2_grpc.add_TalkerServicer_to_server,
        pb2_module=stages_pb2,
        cpu_dtype_probe=lambda model, args: checkpoint_talker_probe(
            model.model, engine_config_from_args(model, args)
        ),
        service="Talker",
        argv=argv,
    )


if __name__ == "__main__":
    main()
