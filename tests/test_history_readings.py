"""When history.py reads the allocator's events (gpumemdoctor/_agent/history.py's check): at a new
high of the allocated peak counter that has come and gone, after the first readings only at larger
rises, once more when a smaller rise has stayed (a gathering loop's last concatenation), and again
when a reading's ring did not reach back to its peak. The reading itself is replaced here: it needs
CUDA (tests/gpu/test_allocated_peak.py)."""
from __future__ import annotations

from types import SimpleNamespace

from gpumemdoctor._agent import history as H

GiB = 1 << 30


def _history():
    sampler = SimpleNamespace(rows=[[0, 0, 0, 0, 0, 0, 0, 0]], live=[True], events=[None])
    agent = SimpleNamespace(sampler=sampler, run_dir="x", trace=SimpleNamespace(mode="auto", on=False))
    h = H.History(agent)
    h.best, h.seen, h.events = [0], [None], [0]
    h.on = True
    done = []

    def read(i):
        h.best[i] = sampler.rows[i][6]
        h.readings += 1
        done.append(sampler.rows[i][6])

    h.read = read
    return h, sampler, done


def _sample(h, sampler, counter, allocated=0):
    sampler.rows[0][6] = counter
    sampler.rows[0][1] = allocated
    h.check("step")


def test_a_gathering_loops_last_small_rise_is_read_once_it_stays():
    h, sampler, done = _history()
    h.readings = H.MAX_READINGS  # the first readings made: only a rise of BIG_RISE is read at once
    h.best[0] = 20 * GiB
    _sample(h, sampler, int(21.3 * GiB))  # +6.5%: not at once
    assert done == []
    _sample(h, sampler, int(21.3 * GiB))  # the same high at the next sample: it stayed, read it
    assert done == [int(21.3 * GiB)]
    _sample(h, sampler, int(21.3 * GiB))  # read already
    assert done == [int(21.3 * GiB)]
    _sample(h, sampler, 25 * GiB)  # +17%: at once
    assert done == [int(21.3 * GiB), 25 * GiB]


def test_a_high_that_is_now_is_read_once_gone_and_a_reading_that_missed_its_peak_is_made_again():
    h, sampler, done = _history()
    _sample(h, sampler, 10 * GiB, allocated=10 * GiB - (1 << 20))  # the high is now: the sample has it
    assert done == [] and h.best[0] == 0
    _sample(h, sampler, 10 * GiB, allocated=GiB)  # gone at the next sample: read it then
    assert done == [10 * GiB]
    h.best[0] = 0
    done.clear()
    h.retry = 0  # (set by a reading whose ring was full and did not reach back)
    _sample(h, sampler, 10 * GiB, allocated=GiB)
    assert done == [10 * GiB] and h.retry is None


def test_a_reading_in_a_library_loop_names_it_and_the_program_line_that_called_it(tmp_path):
    """A reading made while transformers' evaluation loop runs, here inside the program's own callback
    that the loop calls: the loop is named, and the program's line is the one that called the loop,
    not the callback's."""
    library = tmp_path / "site-packages" / "transformers" / "trainer.py"
    library.parent.mkdir(parents=True)
    library.write_text("def evaluation_loop(callback):\n    return callback()\n")
    namespace: dict = {}
    exec(compile(library.read_text(), str(library), "exec"), namespace)
    program = tmp_path / "train.py"
    program.write_text("import sys\n"
                       "def on_prediction_step():\n"
                       "    return LOOP_OF(sys._getframe())\n"
                       "def main():\n"
                       "    return evaluation_loop(on_prediction_step)\n")
    code: dict = {"LOOP_OF": H.loop_of, "evaluation_loop": namespace["evaluation_loop"]}
    exec(compile(program.read_text(), str(program), "exec"), code)
    loop, called, frame = code["main"]()
    assert (loop, called) == ("transformers.Trainer.evaluation_loop", "train.py:5 in main()")
    assert frame.f_code.co_name == "evaluation_loop"
    assert code["on_prediction_step"]() == (None, None, None)  # outside the loop
