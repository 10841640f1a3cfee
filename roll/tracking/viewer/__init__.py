"""The trajectory viewer: a static HTML folder built from a run's dumps and metrics (``roll view``).

See :mod:`roll.tracking.viewer.build` and ``docs/viewer.md``.
"""

from roll.tracking.viewer.build import build_viewer, find_run

__all__ = ["build_viewer", "find_run"]
