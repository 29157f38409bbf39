"""Root conftest: GPU pinning for xdist workers, Hypothesis profiles and the lockstep plugin.

GPU pinning comes first, before anything can start CUDA: with ``LOCKSTEP_GPUS=0,1`` (set by
``scripts/gpu_run.sh`` for ``pytest -n <GPUs> --dist loadfile``), xdist worker ``gw<i>`` sees
only the i-th GPU (``harness.distributed.pin_worker_gpu``); without it nothing changes.

The plugin is also a ``pytest11`` entry point for users' own suites; here it is loaded
explicitly so the checkout works without being installed.
"""
from harness.distributed import pin_worker_gpu

pin_worker_gpu()

import os  # noqa: E402

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", max_examples=12, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "nightly", max_examples=200, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", max_examples=5, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("LOCKSTEP_HYPOTHESIS_PROFILE", "ci"))


def pytest_addhooks(pluginmanager):
    """Register the lockstep plugin unless the installed ``pytest11`` entry point already did.

    Called when this conftest is registered (before the command line is fully parsed, so
    the plugin's options still count). Checking the plugin object itself, not a name, covers
    an installed checkout, an uninstalled one, ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` and
    ``-p lockstep``; ``-p no:lockstep`` blocks the name and is respected.
    """
    import harness.pytest_plugin as lockstep_plugin

    if not pluginmanager.is_registered(lockstep_plugin) and not pluginmanager.is_blocked("lockstep"):
        pluginmanager.register(lockstep_plugin, "lockstep")
