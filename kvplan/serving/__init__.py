"""`kvplan plan`: a traffic mix replayed through the engine's scheduler on its own pool, decode-speed bounds, and
the fleet for N users. plan.py orchestrates; setup.py turns an engine's view of its pool into a replay; pools.py,
stats.py, speed.py and report.py hold the pool, the replay's statistics, the speed model and the answer."""

from kvplan.serving.plan import plan  # noqa: F401
from kvplan.serving.pools import Pool, ServerPool, replay_notes  # noqa: F401
from kvplan.serving.report import PlanReport  # noqa: F401
from kvplan.serving.speed import SpeedModel, SpeedRow, decode_bound, speed_model  # noqa: F401
