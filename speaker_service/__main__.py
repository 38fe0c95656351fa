"""``python -m speaker_service``: the speaker stage process."""

from __future__ import annotations

from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.stage_main import run_stage_process

from .server import SpeakerServicer, add_speaker_arguments, speaker_config_from_args

DEFAULT_PORT = 50054


def main(argv: list[str] | None = None) -> None:
    run_stage_process(
        stage="speaker",
        description="qwen3-tts speaker stage (reference audio -> x-vector + reference codes)",
        default_port=DEFAULT_PORT,
        add_arguments=add_speaker_arguments,
        build_servicer=lambda args: SpeakerServicer(args.model, speaker_config_from_args(args)),
        add_to_server=stages_pb2_grpc.add_SpeakerServicer_to_server,
        pb2_module=stages_pb2,
        service="Speaker",
        argv=argv,
    )


if __name__ == "__main__":
    main()
