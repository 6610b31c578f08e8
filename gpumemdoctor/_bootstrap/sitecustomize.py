"""Loaded at start-up of every Python process of a `gpumemdoctor run`: starts the agent.

It does nothing unless GPUMEMDOCTOR_RUN_DIR is set, removes its own folder from
sys.path so the program sees the path it would have had, and then runs any
sitecustomize module that this one shadows.
"""
import os
import sys


def _gpumemdoctor_bootstrap():
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        if os.environ.get("GPUMEMDOCTOR_RUN_DIR"):
            import time

            started = time.perf_counter()  # the agent's import and start: its cost in the program's start
            try:
                from gpumemdoctor import _agent
            except ImportError:
                # gpumemdoctor runs from a source tree the target cannot see.
                package_parent = os.environ.get("GPUMEMDOCTOR_PACKAGE_PARENT")
                if not package_parent:
                    raise
                sys.path.append(package_parent)
                try:
                    from gpumemdoctor import _agent
                finally:
                    sys.path.remove(package_parent)
            _agent.start(started)
    except Exception:
        pass  # never break the program being measured

    try:
        sys.path[:] = [p for p in sys.path if not p or os.path.abspath(p) != here]
    except Exception:
        pass

    try:
        import importlib.machinery
        import importlib.util

        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
        if spec is not None and spec.loader is not None and spec.origin != __file__:
            module = importlib.util.module_from_spec(spec)
            sys.modules["sitecustomize"] = module
            spec.loader.exec_module(module)
    except Exception as exc:
        # What site.py itself does with a failing sitecustomize.
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
                         f"{type(exc).__name__}: {exc}\n")


_gpumemdoctor_bootstrap()
del _gpumemdoctor_bootstrap
