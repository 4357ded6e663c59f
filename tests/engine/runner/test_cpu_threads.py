"""CpuThreads: the team size follows the cores other processes leave free (samples injected)."""
import pytest

from stallfree.engine import LLMEngine, SamplingParams
from stallfree.engine.runner.cpu_threads import INTERVAL_S, CpuSample, CpuThreads


class FakeMachine:
    """CPU time as /proc/stat, os.times() and schedstat would report it: ``others`` cores busy besides this
    process, which itself keeps ``own_rate`` cores busy and waits runnable ``delayed`` of its time. A busy
    other process makes the team wait (a burner), unless told otherwise (a bursty load generator)."""

    def __init__(self):
        self.wall = self.busy = self.own = self.waited = 0.0
        self.others, self.own_rate, self.delayed = 0.0, 2.0, None
        self.set_calls: list[int] = []
        self.samples = 0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.own += self.own_rate * seconds
        self.busy += (self.own_rate + self.others) * seconds
        delayed = (0.45 if self.others >= 0.5 else 0.0) if self.delayed is None else self.delayed
        self.waited += self.own_rate * seconds * delayed / (1 - delayed)

    def sample(self) -> CpuSample:
        self.samples += 1
        return CpuSample(self.wall, self.busy, self.own, self.waited)

    def clock(self) -> float:
        return self.wall


def governor(machine: FakeMachine, cores: float = 2, max_threads: int = 2) -> CpuThreads:
    return CpuThreads(max_threads, cores=cores, sample=machine.sample, set_threads=machine.set_calls.append,
                      clock=machine.clock)


def run(machine: FakeMachine, threads: CpuThreads, seconds: float) -> int:
    for _ in range(round(seconds / 0.05)):
        machine.advance(0.05)
        n = threads.update()
    return n


def test_a_quiet_machine_keeps_every_core():
    machine = FakeMachine()
    threads = governor(machine)
    assert run(machine, threads, 2.0) == 2 and machine.set_calls == [2]


def test_proc_is_read_once_per_interval_not_every_iteration():
    machine = FakeMachine()
    threads = governor(machine)
    run(machine, threads, 2.0)  # 40 iterations of 50 ms
    assert 2.0 / INTERVAL_S - 1 <= machine.samples <= 1 + 2.0 / INTERVAL_S  # not 41


def test_a_process_on_one_core_leaves_one_thread_and_its_end_gives_the_core_back():
    machine = FakeMachine()
    threads = governor(machine)
    machine.others = 1.0
    assert run(machine, threads, 2.0) == 1
    machine.others = 0.0
    assert run(machine, threads, 2.0) == 2
    assert machine.set_calls == [2, 1, 2]


def test_light_load_beside_the_engine_changes_nothing():
    machine = FakeMachine()
    threads = governor(machine)
    machine.others = 0.3  # e.g. the load generator, a shell
    assert run(machine, threads, 2.0) == 2 and machine.set_calls == [2]


def test_samples_are_taken_at_most_every_interval():
    machine = FakeMachine()
    threads = governor(machine)
    machine.others = 2.0
    machine.advance(INTERVAL_S / 2)
    assert threads.update() == 2  # too soon to tell
    machine.advance(INTERVAL_S)
    assert threads.update() == 1


@pytest.mark.parametrize(("cores", "max_threads", "others", "expected"), [
    (16, 16, 3.0, 13), (16, 8, 3.0, 8), (1.5, 4, 0.0, 1), (4, 4, 10.0, 1)])
def test_team_size_is_the_free_cores_within_the_limits(cores, max_threads, others, expected):
    machine = FakeMachine()
    threads = governor(machine, cores, max_threads)
    machine.others = others
    assert run(machine, threads, 3.0) == expected


def test_each_iteration_records_its_thread_count():
    engine = LLMEngine.from_kwargs(model="tiny", dtype="float32", num_blocks=64)
    engine.add_request([1, 2, 3, 4], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert all(r.cpu_threads >= 1 for r in engine.batch_records)
    fixed = LLMEngine.from_kwargs(model="tiny", dtype="float32", num_blocks=64, adaptive_cpu_threads=False)
    assert fixed.runner.cpu_threads is None


def test_a_busy_core_is_given_up_at_the_first_sample_and_taken_back_only_when_the_load_stays_down():
    machine = FakeMachine()
    threads = governor(machine)
    machine.others = 1.0
    machine.advance(INTERVAL_S)
    assert threads.update() == 1  # one interval is enough to make way
    machine.others = 0.0
    machine.advance(INTERVAL_S)
    assert threads.update() == 1  # one quiet interval is not enough to come back
    assert run(machine, threads, 1.0) == 2


def test_a_load_generator_that_keeps_a_core_busy_without_making_the_team_wait_leaves_it_whole():
    machine = FakeMachine()
    threads = governor(machine)
    machine.others, machine.delayed = 0.9, 0.05  # streaming clients: busy in bursts, between the engine's steps
    assert run(machine, threads, 2.0) == 2 and machine.set_calls == [2]


def test_work_arriving_after_a_short_pause_beside_a_busy_core_starts_on_the_free_core():
    """An idle engine shows no run delay, but then the others' CPU is what they ask for: the first
    iteration after the pause already runs on the core they leave."""
    machine = FakeMachine()
    threads = governor(machine)
    machine.others, machine.own_rate = 1.0, 0.0  # a burner; the engine waits for requests
    machine.advance(INTERVAL_S)
    assert threads.update() == 1


def test_a_pause_beside_a_bursty_client_keeps_every_core():
    machine = FakeMachine()
    threads = governor(machine)
    machine.others, machine.own_rate = 0.3, 0.0
    machine.advance(INTERVAL_S)
    assert threads.update() == 2


def test_a_long_pause_is_not_taken_for_the_load_now():
    """Another server's burst while this one idled (it may be over): the first window after a long pause
    is dropped, and the team decides on the next one, while it works."""
    machine = FakeMachine()
    threads = governor(machine)
    machine.others, machine.own_rate = 2.0, 0.0
    machine.advance(5.0)
    assert threads.update() == 2
    machine.others, machine.own_rate = 0.0, 2.0
    assert run(machine, threads, 1.0) == 2 and machine.set_calls == [2]


def test_an_engine_built_after_a_shrunk_one_starts_from_the_process_team_size():
    """A profile or benchmark builds engines one after another: a team shrunk under load for one engine is
    not the next engine's quiet-machine team size; a count the process itself sets is."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        machine = FakeMachine()
        machine.others = 1.0
        shrunk = CpuThreads(cores=2, sample=machine.sample)
        assert run(machine, shrunk, 1.0) == 1 and torch.get_num_threads() == 1
        assert CpuThreads(cores=2, sample=FakeMachine().sample).max_threads == 2
        torch.set_num_threads(1)  # the process's own choice
        assert CpuThreads(cores=2, sample=FakeMachine().sample).max_threads == 1
    finally:
        torch.set_num_threads(before)
