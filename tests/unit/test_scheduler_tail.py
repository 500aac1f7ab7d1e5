"""--deterministic's rule (Scheduler tail_rows=2): a new turn's prompt never runs in a prefill
run of one row, the one that samples included, however much of it was cached; a continued
turn's next token comes from one row, as a decode's."""

from superfluid.plan import Sampled, StepPlan, StepResult
from superfluid.request import SamplingParams
from superfluid.sched.scheduler import Job, Scheduler

EOG = 0
PROMPT = list(range(100, 140))


def sched(tail_rows: int) -> Scheduler:
    s = Scheduler(lanes=2, n_ctx=256, step_tokens=64, eog=frozenset({EOG}), slots=4, tail_rows=tail_rows)
    s.prefill_budget = 64
    return s


def finish(s: Scheduler, plan: StepPlan) -> None:
    s.update(plan, StepResult(plan.step, tuple(Sampled(r.seq, EOG) for r in plan.runs if r.sample)))


def rows(plan: StepPlan) -> list[tuple[int, int, bool]]:
    return [(r.pos, len(r.tokens), r.sample) for r in plan.runs]


def test_a_warm_prompt_reruns_its_last_two_tokens():
    for tail, want in ((1, [(39, 1, True)]), (2, [(38, 2, True)])):
        s = sched(tail)
        s.add(Job("a", PROMPT, SamplingParams(temperature=0), 1))
        finish(s, s.schedule())  # its KV stays in the slot: the whole prompt is cached
        s.add(Job("b", PROMPT, SamplingParams(temperature=0), 1))
        assert rows(s.schedule()) == want
        assert s.jobs["b"].cached == 40 - tail


def test_no_prefill_run_of_one_row():
    s = sched(2)
    s.prefill_budget = 39  # 39 then 1 would leave a one-row run that samples
    s.add(Job("a", PROMPT, SamplingParams(temperature=0), 1))
    first = s.schedule()
    s.update(first, StepResult(first.step, ()))
    assert rows(first) == [(0, 38, False)] and rows(s.schedule()) == [(38, 2, True)]
    s = sched(2)
    s.prefill_budget = 1  # a budget of one row runs nothing rather than one row
    s.add(Job("a", PROMPT, SamplingParams(temperature=0), 1))
    plan = s.schedule()
    assert plan is None or rows(plan) == []


def test_a_continued_turn_samples_from_one_row():
    s = sched(2)
    s.add(Job("a", PROMPT + [5], SamplingParams(temperature=0), 1))
    finish(s, s.schedule())  # the slot holds the prompt and 5
    s.add(Job("c", PROMPT + [5, 6], SamplingParams(temperature=0), 1, prior=(5, 6)))
    assert rows(s.schedule()) == [(41, 1, True)]


def test_a_prefill_run_has_its_step_to_itself_and_decodes_get_every_other():
    s = sched(2)
    s.prefill_budget = 16
    s.add(Job("a", PROMPT[:8], SamplingParams(temperature=0), 50))
    first = s.schedule()
    s.update(first, StepResult(first.step, tuple(Sampled(r.seq, 7) for r in first.runs if r.sample)))
    s.add(Job("b", PROMPT, SamplingParams(temperature=0), 1))  # 40 tokens: three chunks of 16 or less
    kinds = []
    for _ in range(6):
        plan = s.schedule()
        seqs = {r.seq for r in plan.runs}
        assert len(seqs) == 1, rows(plan)  # never a prefill beside a decode
        kinds.append("prefill" if len(plan.runs[0].tokens) > 1 or plan.runs[0].pos < 8 else "decode")
        s.update(plan, StepResult(plan.step, tuple(Sampled(r.seq, 7) for r in plan.runs if r.sample)))
    assert "decode" in kinds and kinds.count("prefill") >= 2, kinds


def test_the_flag_turns_flash_attention_off_and_refuses_what_it_cannot_keep(capsys):
    from superfluid.cli.engine_config import engine_config
    from superfluid.cli.main import parser
    from superfluid.runtime.registry import embedded_model
    src = embedded_model()
    ec = engine_config(parser().parse_args(["serve", "--deterministic"]), src)
    assert ec.deterministic and ec.flash_attn == "off"
    for extra in (["--speculative", "ngram"], ["--flash-attn", "on"], ["--kv-bits", "8"]):
        assert engine_config(parser().parse_args(["serve", "--deterministic", *extra]), src) == 2
        assert "--deterministic needs the llama.cpp runtime" in capsys.readouterr().err


def test_a_turn_continued_cold_prefills_its_earlier_output_a_row_a_run():
    """A generation cut by a restart: its prompt in runs of two or more that end where its
    output begins, that output one row a run, as it was decoded (with --deterministic only)."""
    prior = (5, 6, 7)
    for tail, want in ((1, [(0, 43, True)]), (2, [(0, 40, False), (40, 1, False), (41, 1, False), (42, 1, True)])):
        s = sched(tail)
        s.add(Job("c", PROMPT + list(prior), SamplingParams(temperature=0), 4, prior=prior))
        got = []
        for _ in range(8):
            plan = s.schedule()
            if plan is None or not plan.runs:
                break
            got += rows(plan)
            s.update(plan, StepResult(plan.step, ()))
            if got[-1][2]:
                break
        assert got == want, (tail, got)


def test_a_cached_prefix_never_leaves_one_prompt_row_before_the_output():
    s = sched(2)
    s.add(Job("a", PROMPT[:-1], SamplingParams(temperature=0), 1))
    finish(s, s.schedule())  # the slot holds all of the prompt but its last token
    s.add(Job("c", PROMPT + [5], SamplingParams(temperature=0), 2, prior=(5,)))
    assert rows(s.schedule()) == [(38, 2, False)]  # 39 of 40 cached would leave one row: 38 kept
