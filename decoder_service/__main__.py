"""``python -m decoder_service``: the decoder stage process."""

from __future__ import annotations

from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.stage_main import run_stage_process

from .server import DecoderServicer, add_decoder_arguments, decoder_config_from_args

DEFAULT_PORT = 50053


def main(argv: list[str] | None = None) -> None:
    run_stage_process(
        stage="decoder",
        description="qwen3-tts decoder stage (codec frames -> 24 kHz audio, seamless streaming)",
        default_port=DEFAULT_PORT,
        add_arguments=add_decoder_arguments,
        build_servicer=lambda args: DecoderServicer(args.model, decoder_config_from_args(args)),
        add_to_server=stages_pb2_grpc.add_DecoderServicer_to_server,
        pb2_module=stages_pb2,
        service="Decoder",
        argv=argv,
    )


if __name__ == "__main__":
    main()
