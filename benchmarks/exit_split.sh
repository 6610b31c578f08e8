# Where the exit of corpus/hf_gpt2_124m_adamw.py goes, plain against under gpumemdoctor run (and under
# it with --trace off), PAIRS interleaved rounds (default 2): from the program's last step
# (LOOP_LAST_EPOCH_S) and its atexit (EXIT_EPOCH_S) to our last atexit hook, to the end of module
# teardown (TD_MAIN_GLOBALS), to the end as the shell sees it. On the GPU machine:
#   OUT=dir [PAIRS=3] [VARIANTS="plain tool"] bash benchmarks/exit_split.sh
export PATH=$HOME/.local/bin:$PATH
python3 -m pip install -q --no-deps --no-build-isolation . > $OUT/install.log 2>&1 || tail -5 $OUT/install.log
P=${PROGRAM:-corpus/hf_gpt2_124m_adamw.py}
for i in $(seq 1 ${PAIRS:-2}); do
  for v in ${VARIANTS:-plain tool}; do
    case $v in
      plain) python3 benchmarks/exit_teardown.py $P > $OUT/$v$i.log 2>&1 ;;
      tool) gpumemdoctor run -q --force -o $OUT/$v$i.json benchmarks/exit_teardown.py $P > $OUT/$v$i.log 2>&1 ;;
      trace_off) gpumemdoctor run -q --force --trace off -o $OUT/$v$i.json benchmarks/exit_teardown.py $P > $OUT/$v$i.log 2>&1 ;;
    esac
    echo "ENDED $(date +%s.%N)" >> $OUT/$v$i.log
  done
done
python3 - <<'PY'
import glob, json, os
out = os.environ["OUT"]
print("run          after  atexit modules C-teardown tool-end agent-exit")
for log in sorted(glob.glob(out + "/*.log")):
    name = os.path.basename(log)[:-4]
    if name == "install":
        continue
    f = {}
    for line in open(log):
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("LOOP_LAST_EPOCH_S", "EXIT_EPOCH_S", "TD_ATEXIT_LAST", "TD_MAIN_GLOBALS", "ENDED"):
            f[parts[0]] = float(parts[1])
    end = f["ENDED"]
    agent = 0.0
    report = os.path.join(out, name + ".json")
    if os.path.exists(report):
        rec = json.load(open(report))["recording"]
        end = rec["started_wall"] + rec["duration_s"]
        for a in rec["agents"]:
            cost = (a.get("exit_info") or {}).get("cost") or {}
            agent += sum(v for k, v in cost.items() if k.startswith("exit_"))
    print(f"{name:12s} {f['ENDED'] - f['LOOP_LAST_EPOCH_S']:6.3f} {f['TD_ATEXIT_LAST'] - f['EXIT_EPOCH_S']:6.3f} "
          f"{f['TD_MAIN_GLOBALS'] - f['TD_ATEXIT_LAST']:7.3f} {end - f['TD_MAIN_GLOBALS']:10.3f} "
          f"{f['ENDED'] - end:8.3f} {agent:10.3f}")
PY
