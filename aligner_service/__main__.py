"""``python -m aligner_service``: the aligner stage process (``--model`` is an aligner checkpoint
in the released Qwen3-ForcedAligner layout)."""

from __future__ import annotations

from tts_common.pb.qwen3tts.internal.v1 import stages_pb2, stages_pb2_grpc
from tts_common.stage_main import run_stage_process

from .config import FLAGS, aligner_config_from_args
from .model import AlignInput, load_aligner
from .model.dtype_probe import checkpoint_aligner_probe
from .server import AlignerServicer


def main(argv: list[str] | None = None) -> None:
    """Run the aligner stage with the command line ``argv`` (default: ``sys.argv[1:]``)."""
    run_stage_process(
        flags=FLAGS,
        build_servicer=lambda model, args: AlignerServicer(
            model.model,
            aligner_config_from_args(model, args),
            load_model=load_aligner,
            make_input=AlignInput,
        ),
        add_to_server=stages_pb2_grpc.add_AlignerServicer_to_server,
        pb2_module=stages_pb2,
        cpu_dtype_probe=lambda model, args: checkpoint_aligner_probe(model.model),
        service="Aligner",
        argv=argv,
    )


if __name__ == "__main__":
    main()
