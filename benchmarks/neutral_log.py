"""Where the agent's gc ballast goes, reading by reading: patches a COPY of the package so that
Neutral.read and Bulk.run log each reading's counts into an array (no container: the log itself
must not move the count), written at the process's exit to $NEUTRAL_LOG_DIR/neutral-PID.txt.

    rm -rf /tmp/dbgpkg && mkdir /tmp/dbgpkg && cp -r gpumemdoctor /tmp/dbgpkg/
    python3 benchmarks/neutral_log.py /tmp/dbgpkg/gpumemdoctor/_agent/neutral.py
    NEUTRAL_LOG_DIR=$PWD/nl PYTHONPATH=/tmp/dbgpkg python3 -m gpumemdoctor run scenarios/clean_sawtooth.py

Columns: the reading's function, on the main thread (1/0), the count at its start (c0), after the
lift (c1), dicts the full free list destroyed, objects the reading made (created), dicts lent, the
ballast before it put the count back, the reserve after, the count at the end (== c0 when put
back) and the ballast after. `neutral_log.py --count DIR` prints count_left_higher and the
ballast of every agent in the reports under DIR (GPUMEMDOCTOR_FIXTURE_DIR of tests/gpu). Bulk's rows: lent/destroyed 0, reserve = its kept objects. What it
found: benchmarks/results/2026-11-28-h200-neutral-ballast.txt. Never installed with the package."""
import glob, json, os, sys

if sys.argv[1:2] == ["--count"]:  # neutral_log.py --count DIR: each agent's figures in DIR's reports
    for f in sorted(glob.glob(os.path.join(sys.argv[2], "**", "*.json"), recursive=True)):
        try:
            agents = json.load(open(f))["recording"]["agents"]
        except Exception:
            continue
        for a in agents:
            c = (a.get("exit_info") or {}).get("collector") or {}
            if c.get("count_left_higher") is not None:
                print(f, a["pid"], "count_left_higher", c["count_left_higher"], "ballast", c.get("ballast"))
    sys.exit(0)
p = sys.argv[1]
s = open(p).read()
s = s.replace("import gc\n", """import gc
import array as _array, atexit as _atexit, os as _os, threading as _threading
_LOG = _array.array('q')
_NAMES = {}
_MAIN = _threading.main_thread().ident
def _dump():
    d = _os.environ.get('NEUTRAL_LOG_DIR')
    if not d: return
    names = {v: k for k, v in _NAMES.items()}
    with open(_os.path.join(d, 'neutral-%d.txt' % _os.getpid()), 'w') as f:
        f.write('fn main c0 c1 destroyed created lent ballast_before reserve_after c_end ballast_after\\n')
        L = _LOG
        for i in range(0, len(L), 11):
            r = L[i:i+11]
            f.write(' '.join([names.get(r[0], '?')] + [str(x) for x in r[1:]]) + '\\n')
_atexit.register(_dump)
""", 1)
s = s.replace("""            c = get()[0]
            if len(reserve) > self.lend and c > 0:""", """            _bb = len(ballast)
            c = get()[0]
            if len(reserve) > self.lend and c > 0:""")
s = s.replace("""            self.t3 = (c, c0, n)
        return result""", """            _k = _NAMES.setdefault(getattr(fn, '__qualname__', 'x'), len(_NAMES))
            _LOG.extend((_k, _threading.get_ident() == _MAIN, c0, c1, destroyed, created, lent, _bb, len(reserve), c, len(ballast)))
            self.t3 = (c, c0, n)
        return result""")
s = s.replace("""            c = _put_back(self.ballast, get()[0], c0)
            if c > c0:
                self.short += 1
            self.t3 = (c, c0, 0)""", """            _bb = len(self.ballast)
            _c1 = get()[0]
            c = _put_back(self.ballast, _c1, c0)
            if c > c0:
                self.short += 1
            _k = _NAMES.setdefault('BULK:' + getattr(fn, '__qualname__', 'x'), len(_NAMES))
            _LOG.extend((_k, _threading.get_ident() == _MAIN, c0, _c1, 0, _c1 - c0, 0, _bb, len(kept), c, len(self.ballast)))
            self.t3 = (c, c0, 0)""")
assert s.count('_LOG.extend') == 2, s.count('_LOG.extend')
open(p, 'w').write(s)
