"""Counter-based RNG and per-lane sampling."""

import numpy as np
import pytest

from superfluid.request import SamplingParams
from superfluid.runtime.sampling import LaneSampler, log_softmax, uniform

V = 16
NO_EOG = np.array([], dtype=np.int64)


def sampler(history: tuple[int, ...] = (), eog: np.ndarray = NO_EOG, **kw) -> LaneSampler:
    return LaneSampler(SamplingParams(**kw), history, eog)


def draws(logits: np.ndarray, n: int = 300, **kw) -> list[int]:
    """Tokens drawn at positions 0..n-1, each by a fresh sampler (no penalty state)."""
    return [sampler(**kw).sample(0, logits, pos).token for pos in range(n)]


def random_logits(seed: int = 0, v: int = V) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=v).astype(np.float32)


# -- uniform ----------------------------------------------------------------------------

def test_uniform_is_deterministic():
    assert uniform(42, 7) == uniform(42, 7)


def test_uniform_is_in_unit_interval_and_roughly_uniform():
    xs = [uniform(s, p) for s in range(4) for p in range(2500)]
    assert all(0.0 <= x < 1.0 for x in xs)
    assert abs(np.mean(xs) - 0.5) < 0.02
    assert len(set(xs)) == len(xs)


def test_uniform_differs_across_seeds_and_positions():
    assert uniform(1, 0) != uniform(2, 0)
    assert uniform(1, 0) != uniform(1, 1)
    assert uniform(0, 1) != uniform(1, 0)


def test_uniform_accepts_large_and_negative_keys():
    for s, p in [(2**64 + 5, 3), (-1, 0), (0, 2**70)]:
        assert 0.0 <= uniform(s, p) < 1.0


# -- sampling ---------------------------------------------------------------------------

def test_greedy_is_argmax():
    for seed in range(5):
        x = random_logits(seed)
        assert sampler(temperature=0.0).sample(3, x, 0).token == int(np.argmax(x))


def test_sample_reports_the_lane():
    assert sampler(temperature=0.0).sample(5, random_logits(), 0).seq == 5


def test_same_seed_and_position_draw_the_same_token():
    x = np.zeros(V, dtype=np.float32)  # flat: every token equally likely
    a = draws(x, 50, seed=123)
    assert a == draws(x, 50, seed=123)
    assert len(set(a)) > 4  # positions give different draws
    assert a != draws(x, 50, seed=124)


def test_draw_does_not_depend_on_the_sampler_history_without_penalties():
    x = random_logits(1)
    s = sampler(seed=9)
    for pos in range(10):
        s.sample(0, x, pos)
    assert s.sample(0, x, 77).token == sampler(seed=9).sample(0, x, 77).token


def test_draws_follow_the_distribution():
    x = np.full(V, -30.0, dtype=np.float32)
    x[4], x[11] = 0.0, np.log(3.0)  # p(11) = 0.75, p(4) = 0.25
    got = draws(x, 2000, seed=5)
    assert set(got) == {4, 11}
    assert 0.70 < got.count(11) / len(got) < 0.80


def test_top_k_one_is_argmax_even_at_temperature_one():
    x = np.zeros(V, dtype=np.float32)
    x[9] = 0.5  # barely ahead: without top_k, other tokens are drawn often
    assert set(draws(x, 200, top_k=1, seed=3)) == {9}
    assert len(set(draws(x, 200, seed=3))) > 1


def test_top_k_restricts_to_the_k_best():
    x = np.arange(V, dtype=np.float32) * 0.1  # the best are 15, 14, 13
    assert set(draws(x, 300, top_k=3, seed=1)) == {13, 14, 15}


def test_min_p_drops_tokens_below_the_fraction_of_the_best():
    x = np.full(V, 2.0, dtype=np.float32)
    x[3], x[5] = 5.0, 4.5  # p5/p3 = e^-0.5 ~ 0.61; others/p3 = e^-3 ~ 0.05
    assert set(draws(x, 300, min_p=0.5, seed=2)) == {3, 5}
    assert set(draws(x, 300, min_p=0.7, seed=2)) == {3}
    assert len(set(draws(x, 300, seed=2))) > 2


def test_top_p_keeps_the_smallest_nucleus():
    p = np.full(V, 0.1 / 14)
    p[2], p[9] = 0.6, 0.3
    x = np.log(p).astype(np.float32)
    assert set(draws(x, 300, top_p=0.8, seed=4)) == {2, 9}
    assert set(draws(x, 300, top_p=0.5, seed=4)) == {2}
    assert len(set(draws(x, 300, seed=4))) > 2


def test_top_p_over_a_large_vocabulary():
    x = np.zeros(1000, dtype=np.float32)
    x[[10, 500, 999]] = 10.0  # these three hold ~0.98 of the mass
    assert set(draws(x, 300, top_p=0.9, seed=6)) == {10, 500, 999}


def test_ignore_eos_bans_eog_tokens():
    x = np.zeros(V, dtype=np.float32)
    x[0], x[1], x[6] = 10.0, 9.0, 1.0
    eog = np.array([0, 1])
    assert sampler(temperature=0.0, eog=eog).sample(0, x, 0).token == 0
    assert sampler(temperature=0.0, eog=eog, ignore_eos=True).sample(0, x, 0).token == 6
    assert not {0, 1} & set(draws(x, 200, eog=eog, ignore_eos=True, seed=8))


def test_presence_penalty_lowers_a_seen_token():
    x = np.zeros(V, dtype=np.float32)
    x[4], x[6] = 1.0, 0.9
    assert sampler(temperature=0.0, presence_penalty=0.5).sample(0, x, 0).token == 4
    assert sampler((4,), temperature=0.0, presence_penalty=0.5).sample(0, x, 0).token == 6


def test_presence_penalty_counts_tokens_the_sampler_drew():
    x = np.zeros(V, dtype=np.float32)
    x[4], x[6] = 1.0, 0.9
    s = sampler(temperature=0.0, presence_penalty=0.5)
    assert [s.sample(0, x, p).token for p in range(2)] == [4, 6]


def test_frequency_penalty_scales_with_the_count():
    x = np.zeros(V, dtype=np.float32)
    x[4], x[6] = 1.0, 0.75
    assert sampler((4,), temperature=0.0, frequency_penalty=0.1).sample(0, x, 0).token == 4
    assert sampler((4, 4, 4), temperature=0.0, frequency_penalty=0.1).sample(0, x, 0).token == 6


def test_repeat_penalty_divides_a_positive_logit():
    x = np.zeros(V, dtype=np.float32)
    x[4], x[6] = 2.0, 1.5
    assert sampler((4,), temperature=0.0, repeat_penalty=1.5).sample(0, x, 0).token == 6
    assert sampler((6,), temperature=0.0, repeat_penalty=1.5).sample(0, x, 0).token == 4


def test_penalties_do_not_change_the_callers_logits():
    x = random_logits(2)
    before = x.copy()
    sampler((1, 2, 3), presence_penalty=1.0, ignore_eos=True, eog=np.array([0])).sample(0, x, 0)
    assert np.array_equal(x, before)


# -- logprobs -----------------------------------------------------------------------------

def test_no_logprobs_by_default():
    s = sampler(temperature=0.0).sample(0, random_logits(), 0)
    assert s.logprob is None and s.top == ()


def test_top_logprobs_zero_gives_only_the_chosen_token():
    x = random_logits(3)
    s = sampler(temperature=0.0, top_logprobs=0).sample(0, x, 0)
    assert s.top == ()
    assert s.logprob == pytest.approx(float(log_softmax(x)[s.token]))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_top_logprobs_are_sorted_and_match_log_softmax(temperature):
    x = random_logits(4)
    ref = np.log(np.exp(x.astype(np.float64)) / np.exp(x.astype(np.float64)).sum())
    s = sampler(temperature=temperature, top_logprobs=5, seed=1).sample(0, x, 3)
    assert s.logprob == pytest.approx(ref[s.token])
    ids = [t for t, _ in s.top]
    lps = [lp for _, lp in s.top]
    assert ids == list(np.argsort(-ref)[:5])
    assert lps == sorted(lps, reverse=True)
    assert lps == pytest.approx(list(ref[ids]))


def test_tied_top_logprobs_are_ordered_by_token_id():
    x = np.zeros(V, dtype=np.float32)
    x[[7, 5, 3, 1]] = 1.0
    s = sampler(temperature=0.0, top_logprobs=4).sample(0, x, 0)
    assert [t for t, _ in s.top] == [1, 3, 5, 7]


def test_top_logprobs_larger_than_the_vocabulary():
    x = random_logits(5, v=4)
    s = sampler(temperature=0.0, top_logprobs=20).sample(0, x, 0)
    assert len(s.top) == 4
    assert sum(np.exp(lp) for _, lp in s.top) == pytest.approx(1.0)


def test_log_softmax_normalizes_and_is_stable():
    x = np.array([1000.0, 1000.0, 0.0], dtype=np.float32)
    lp = log_softmax(x)
    assert np.all(np.isfinite(lp))
    assert np.exp(lp).sum() == pytest.approx(1.0)
    assert lp[0] == pytest.approx(np.log(0.5))


# -- logit_bias ---------------------------------------------------------------------------

def test_logit_bias_ban_changes_the_greedy_token():
    x = np.array([0.0, 5.0, 4.0, 1.0], dtype=np.float32)
    assert sampler(temperature=0.0).sample(0, x, 0).token == 1
    assert sampler(temperature=0.0, logit_bias=((1, -100.0),)).sample(0, x, 0).token == 2


def test_logit_bias_plus_100_forces_a_token():
    x = random_logits(3)
    worst = int(np.argmin(x))
    assert sampler(temperature=0.0, logit_bias=((worst, 100.0),)).sample(0, x, 0).token == worst
    assert {sampler(temperature=1.0, seed=s, logit_bias=((worst, 100.0),)).sample(0, x, 0).token
            for s in range(50)} == {worst}


def test_a_banned_token_is_never_drawn():
    x = np.zeros(V, dtype=np.float32)
    assert 3 not in draws(x, 400, temperature=1.0, logit_bias=((3, -100.0),))


def test_a_small_bias_shifts_the_logit():
    x = np.array([1.0, 1.5], dtype=np.float32)
    assert sampler(temperature=0.0, logit_bias=((0, 1.0),)).sample(0, x, 0).token == 0
    assert sampler(temperature=0.0, logit_bias=((0, 0.4),)).sample(0, x, 0).token == 1


def test_logit_bias_leaves_logprobs_of_the_raw_distribution_and_the_callers_logits():
    x = random_logits(4)
    before = x.copy()
    s = sampler(temperature=0.0, top_logprobs=0, logit_bias=((0, -100.0),)).sample(0, x, 0)
    assert np.array_equal(x, before)
    assert s.token != 0 and s.logprob == pytest.approx(float(log_softmax(x)[s.token]))


def test_logit_bias_survives_the_wire():
    sp = SamplingParams(logit_bias=((5, -100.0), (7, 2.5)), grammar="g")
    w = sp.to_wire()
    assert w[10] == "g"
    assert SamplingParams.from_wire(w) == sp
    assert SamplingParams.from_wire(w[:11]).logit_bias == ()  # an older peer's list
    assert SamplingParams(logit_bias=[[5, -100], [7, 2.5]]) == sp.__class__(logit_bias=((5, -100.0), (7, 2.5)))


# -- penalties over the context, repeat_last_n, typical_p ----------------------------------

def test_penalties_count_the_prompt_context():
    x = np.zeros(V, dtype=np.float32)
    x[4], x[6] = 1.0, 0.9
    s = LaneSampler(SamplingParams(temperature=0.0, presence_penalty=0.5), (), NO_EOG, None, (1, 4, 2))
    assert s.sample(0, x, 0).token == 6


def test_repeat_last_n_counts_only_the_last_n_tokens_of_context_and_output():
    x = np.zeros(V, dtype=np.float32)
    x[4], x[6], x[8] = 1.0, 0.9, 0.8
    sp = SamplingParams(temperature=0.0, presence_penalty=0.5, repeat_last_n=2)
    assert LaneSampler(sp, (), NO_EOG, None, (4, 1, 2)).sample(0, x, 0).token == 4  # 4 left the window
    assert LaneSampler(sp, (), NO_EOG, None, (1, 4, 2)).sample(0, x, 0).token == 6
    s = LaneSampler(sp, (), NO_EOG, None, (1, 2))
    # 4, then 6 (4 is in the window), then 8 (4 and 6 are), then 4 again (it left the window)
    assert [s.sample(0, x, p).token for p in range(4)] == [4, 6, 8, 4]


def test_repeat_last_n_zero_turns_penalties_off():
    x = np.zeros(V, dtype=np.float32)
    x[4], x[6] = 1.0, 0.9
    sp = SamplingParams(temperature=0.0, presence_penalty=0.5, repeat_last_n=0)
    assert not sp.penalized
    assert LaneSampler(sp, (4, 4), NO_EOG, None, (4,)).sample(0, x, 0).token == 4


def test_a_resumed_lane_penalizes_as_an_uninterrupted_one():
    logits = [random_logits(i) for i in range(12)]
    sp = SamplingParams(temperature=0.8, seed=5, frequency_penalty=0.7, repeat_penalty=1.3, repeat_last_n=5)
    whole = LaneSampler(sp, (), NO_EOG, None, (3, 9, 3))
    out = [whole.sample(0, x, p).token for p, x in enumerate(logits)]
    resumed = LaneSampler(sp, tuple(out[:7]), NO_EOG, None, (3, 9, 3))
    assert [resumed.sample(0, x, p).token for p, x in enumerate(logits[7:], 7)] == out[7:]


def test_typical_p_keeps_the_tokens_nearest_the_entropy():
    # one likelier token among 15 equal ones (p 0.15 vs 0.056): its surprise (1.9 nats) is
    # farther from the entropy (2.7) than theirs (2.9), so a small typical mass leaves it out
    x = np.zeros(V, dtype=np.float32)
    x[0] = 1.0
    assert 0 in draws(x, 200, temperature=1.0)
    got = draws(x, 200, temperature=1.0, typical_p=0.2)
    assert 0 not in got and len(set(got)) > 1
    assert draws(x, 50, temperature=1.0, typical_p=1.0) == draws(x, 50, temperature=1.0)


def test_typical_p_does_not_touch_greedy():
    x = random_logits(6)
    assert sampler(temperature=0.0, typical_p=0.1).sample(0, x, 0).token == int(np.argmax(x))


def test_new_fields_survive_the_wire():
    sp = SamplingParams(typical_p=0.5, repeat_last_n=64, grammar="g")
    assert SamplingParams.from_wire(sp.to_wire()) == sp and sp.to_wire()[10] == "g"


def test_post_sampling_logprobs_are_of_the_distribution_the_token_was_drawn_from():
    """llama-server's post_sampling_probs: top-k 3 at temperature 0.5 leaves three tokens; their
    probabilities (renormalised) sum to 1 and the drawn token is among them, with its own."""
    x = random_logits(3)
    for pos in range(20):
        s = sampler(temperature=0.5, top_k=3, top_logprobs=10, post_sampling=True, seed=9).sample(0, x, pos)
        assert len(s.top) == 3 and [t for t, _ in s.top] == list(np.argsort(-x)[:3])
        assert sum(np.exp(lp) for _, lp in s.top) == pytest.approx(1.0)
        assert (s.token, s.logprob) in s.top
        z = np.exp((x[np.argsort(-x)[:3]] - x.max()) / 0.5)
        assert np.exp(s.top[0][1]) == pytest.approx(z[0] / z.sum(), rel=1e-5)
    greedy = sampler(temperature=0.0, top_logprobs=5, post_sampling=True).sample(0, x, 0)
    assert (greedy.logprob, greedy.top) == (0.0, ((int(np.argmax(x)), 0.0),))
    raw = sampler(temperature=0.5, top_k=3, top_logprobs=10, seed=9).sample(0, x, 0)
    assert len(raw.top) == 10  # without it: the model's own distribution, every token
