"""``surreal-redis launch``: one experiment on this machine. :mod:`.supervisor` prepares the run
and supervises it, :mod:`.children` starts and restarts its processes, :mod:`.final_eval` ends it
with the final eval and the summary. The run's folder is :mod:`surreal_redis.run_folder`'s."""

from surreal_redis.launcher.supervisor import Launcher, LaunchError

__all__ = ["LaunchError", "Launcher"]
