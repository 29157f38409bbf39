"""Root conftest: GPU pinning for xdist workers, Hypothesis profiles and the lockstep plugin.

Under pytest-xdist, each worker's numerical libraries run one thread
(``pytest_configure``): ``make test`` runs one worker per core, and OpenBLAS, OpenMP and
torch would otherwise each start one thread per core in every worker (four on two cores;
``test_architectures`` beside another worker took 52 s instead of 25 s).

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


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def pytest_configure(config):
    """On the xdist controller, before it starts the workers (they inherit the environment
    and read it as they load numpy and torch): one thread each, unless the user set them."""
    if getattr(config.option, "numprocesses", None) and not os.environ.get(
            "PYTEST_XDIST_WORKER"):
        for name in THREAD_VARIABLES:
            if name not in os.environ:
                os.environ[name] = "1"
                os.environ["LOCKSTEP_SUITE_ONE_THREAD"] = "1"


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
