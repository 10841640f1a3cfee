"""Run the agentic pipeline: ``python examples/start_agentic_pipeline.py --config-name sokoban_tiny [key=value]``."""

import sys

from roll.config.agentic import AgenticConfig
from roll.launch.command import run_pipeline
from roll.pipelines.agentic_pipeline import AgenticPipeline

if __name__ == "__main__":
    sys.exit(run_pipeline(sys.argv[1:], AgenticConfig, AgenticPipeline, default_config="sokoban_tiny"))
