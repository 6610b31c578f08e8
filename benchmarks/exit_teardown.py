"""Run a program (runpy, as __main__) and print where its interpreter's shutdown spends its time:
TD_ATEXIT_LAST (our atexit hook, registered first so it runs last) and TD_MAIN_GLOBALS (a global of
the program's main module, let go of when the interpreter clears the modules). Times are
time.time(), the clock of corpus/_common.py's EXIT_EPOCH_S. Usage: exit_teardown.py PROGRAM [ARGS]."""
import atexit
import os
import runpy
import sys
import time

atexit.register(lambda: print(f"TD_ATEXIT_LAST {time.time():.4f}", flush=True))


class _Mark:
    def __init__(self, name):
        self.name = name

    def __del__(self):
        try:
            os.write(1, f"{self.name} {time.time():.4f}\n".encode())
        except Exception:
            pass


path = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(path))
runpy.run_path(path, init_globals={"_td_mark": _Mark("TD_MAIN_GLOBALS")}, run_name="__main__")
