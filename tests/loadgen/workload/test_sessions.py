"""Multi-turn session workloads: each turn's prompt is the history plus a new message, sessions arrive by the
arrival process, a context that outgrows max_total_tokens ends its session with a recorded reason."""
import numpy as np
import pytest

from stallfree.engine.config_checks import ConfigError
from stallfree.engine.records.request_spec import CONTEXT_LIMIT, LAST_TURN, REQUEST_LIMIT, session_groups
from stallfree.loadgen.workload.prefix_reuse import ideal_hit_rate
from stallfree.loadgen.workload.request_specs import build_workload

POISSON = {"kind": "poisson", "qps": 2.0}


def by_session(specs):
    return [[specs[i] for i in group] for group in session_groups(specs)]


@pytest.mark.parametrize("lengths", [{"kind": "chat_sessions"}, {"kind": "agentic_sessions"}])
def test_each_turn_resends_the_history(lengths):
    specs = build_workload(POISSON, lengths, 120, seed=0, vocab_size=1000)
    assert len(specs) == 120
    sessions = by_session(specs)
    assert len(sessions) > 3 and sum(map(len, sessions)) == 120
    starts = [session[0].send_offset_s for session in sessions]
    assert starts == sorted(starts) and starts[0] == 0.0
    for session in sessions:
        assert [s.turn for s in session] == list(range(len(session)))
        assert all(s.send_offset_s == session[0].send_offset_s for s in session)
        assert session[0].think_time_s == 0.0 and all(s.think_time_s >= 0 for s in session)
        for before, after in zip(session, session[1:], strict=False):
            history = before.prompt_token_ids
            assert after.prompt_token_ids[:len(history)] == history  # the history, then its answer and a message
            assert len(after.prompt_token_ids) > len(history) + before.max_tokens
        assert [s.session_end for s in session[:-1]] == [None] * (len(session) - 1)
        assert session[-1].session_end in (LAST_TURN, REQUEST_LIMIT)
    assert sessions[-1][-1].session_end in (LAST_TURN, REQUEST_LIMIT)


def test_agents_share_their_system_prompt_and_reuse_exceeds_chat():
    agentic = build_workload(POISSON, {"kind": "agentic_sessions", "system_len": 512, "tools_len": 256}, 60, 0, 1000)
    firsts = [session[0].prompt_token_ids for session in by_session(agentic)]
    assert all(first[:768] == firsts[0][:768] for first in firsts)
    assert len({tuple(first[768:800]) for first in firsts}) == len(firsts)  # each task its own
    chat = build_workload(POISSON, {"kind": "chat_sessions"}, 60, 0, 1000)
    agentic_rate = ideal_hit_rate([s.prompt_token_ids for s in agentic], 16)
    assert agentic_rate > ideal_hit_rate([s.prompt_token_ids for s in chat], 16) > 0.3


def test_a_context_over_max_total_tokens_ends_its_session():
    specs = build_workload(POISSON, {"kind": "chat_sessions", "turns": 50, "user_len": 64, "output_len": 32}, 30, 0,
                           1000, max_total_tokens=600)
    assert all(len(s.prompt_token_ids) + s.max_tokens <= 600 for s in specs)
    sessions = by_session(specs)
    assert all(session[-1].session_end == CONTEXT_LIMIT for session in sessions[:-1])
    assert all(len(session) == 6 for session in sessions[:-1])  # 64 + 5 x 96 + 32 fits 600; a 7th turn does not


def test_a_first_turn_over_max_total_tokens_is_cut_and_ends_its_session():
    specs = build_workload(POISSON, {"kind": "agentic_sessions", "system_len": 900, "tools_len": 0}, 4, 0, 1000,
                           max_total_tokens=256)
    assert [(s.turn, s.session_end) for s in specs] == [(0, CONTEXT_LIMIT)] * 4
    assert all(len(s.prompt_token_ids) + s.max_tokens <= 256 for s in specs)


def test_the_same_seed_gives_the_same_sessions_and_think_times_follow_their_mean():
    lengths = {"kind": "chat_sessions", "turns": 10, "think_time_s": 3.0}
    one, two = (build_workload(POISSON, lengths, 4000, 7, 1000) for _ in range(2))
    assert [s.prompt_token_ids for s in one] == [s.prompt_token_ids for s in two]
    thinks = np.array([s.think_time_s for s in one if s.turn > 0])
    assert thinks.mean() == pytest.approx(3.0, rel=0.05)
    none = build_workload(POISSON, {**lengths, "think_time_s": 0}, 20, 7, 1000)
    assert {s.think_time_s for s in none} == {0.0}


@pytest.mark.parametrize("lengths, message", [
    ({"kind": "chat_sessions", "turns": [4, 2]}, "lengths.turns must be an integer >= 1 or a range"),
    ({"kind": "chat_sessions", "think_time_s": -1}, "lengths.think_time_s must be a number >= 0"),
    ({"kind": "agentic_sessions", "system_len": -5}, "lengths.system_len must be an integer >= 0"),
    ({"kind": "chat_sessions", "turn": 3}, "lengths.turn is not a setting of kind 'chat_sessions'"),
])
def test_bad_session_settings_name_the_key(lengths, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")) as error:
        build_workload(POISSON, lengths, 10, 0, 1000)
    assert error.type in (ConfigError, ValueError)
