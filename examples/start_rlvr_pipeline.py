"""Run the RLVR pipeline: ``python examples/start_rlvr_pipeline.py --config-name rlvr_tiny [key=value ...]``."""

import sys

from roll.config.rlvr import RLVRConfig
from roll.launch.command import run_pipeline
from roll.pipelines.rlvr_pipeline import RLVRPipeline

if __name__ == "__main__":
    sys.exit(run_pipeline(sys.argv[1:], RLVRConfig, RLVRPipeline, default_config="rlvr_tiny"))
