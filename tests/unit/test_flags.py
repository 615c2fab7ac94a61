"""The per-request flag schema: defaults, canonical form, and every class of bad flag."""
import json

import pytest

from vllm_rl.flags import FlagError, extract, normalize, parse, rl_params, rl_xargs


def test_defaults_follow_the_paper():
    flags = parse(normalize(rl_params(group={"size": 8}, darts=True)["vllm_rl"], n=16,
                            default_group_id="g"))
    assert flags.group.size == 8 and flags.group.redundant == 16 and flags.group.id == "g"
    assert flags.darts.mode == "auto" and flags.darts.k == 7 and flags.darts.m_up == 16
    # Alg. 2: shortest-only with early stop once M' reaches M_up = 2M, dual-end below it.
    assert flags.darts.early_stop(flags.group)
    below = parse(normalize({"group": {"size": 8}, "darts": {}}, n=12, default_group_id="g"))
    assert not below.darts.early_stop(below.group)


def test_duet_defaults_follow_the_paper_and_need_no_group():
    flags = parse(normalize({"duet": {}}, n=1))
    assert flags.group is None
    d = flags.duet
    assert (d.marker, d.grace, d.eps, d.poll, d.k1, d.k2) == ("math", 150, 0.05, 8, None, None)


def test_no_flags_means_no_technique():
    assert extract(None) is None and extract({"other": 1}) is None
    assert parse(normalize({}, n=1)) == parse({})


def test_group_sent_as_separate_requests_needs_an_id():
    raw = {"group": {"id": "p7", "size": 8, "redundant": 16}, "darts": {"mode": "shortest"}}
    flags = parse(normalize(raw, n=1))
    assert flags.group.id == "p7" and flags.group.redundant == 16


def test_server_forms_are_the_same_schema():
    nested = rl_params(group={"size": 4}, darts={"mode": "dual_end", "k": 3})
    as_json = rl_xargs(group={"size": 4}, darts={"mode": "dual_end", "k": 3})
    dotted = {"vllm_rl.group.size": 4, "vllm_rl.darts.mode": "dual_end", "vllm_rl.darts.k": 3}
    forms = [normalize(extract(x), n=8, default_group_id="g") for x in (nested, as_json, dotted)]
    assert forms[0] == forms[1] == forms[2]
    assert json.loads(as_json["vllm_rl"]) == nested["vllm_rl"]


@pytest.mark.parametrize("raw, n, flag, allowed", [
    ({"dartz": {}}, 1, "dartz", "one of group, darts"),                        # unknown section
    ({"darts": {"mod": "x"}, "group": {"size": 2}}, 2, "darts.mod", "one of mode, k, m_up"),  # unknown key
    ({"group": {"size": "8"}}, 8, "group.size", "int in [1, 4096]"),            # wrong type
    ({"group": {"size": True}}, 8, "group.size", "int in [1, 4096]"),           # bool is not int
    ({"group": {"size": 0}}, 8, "group.size", "int in [1, 4096]"),              # out of range
    ({"darts": {"mode": "longest"}}, 8, "darts.mode", "one of 'auto', 'dual_end', 'shortest'"),
    ({"group": {"size": 8}}, 4, "group.redundant", "int in [8, 4096]"),         # M' < M
    ({"group": {"redundant": 4}}, 8, "group.redundant", "equal to n (8)"),      # inconsistent n
    ({"group": {"size": 4}, "darts": {"k": 5}}, 8, "darts.k", "int in [0, 4]"),  # K > M
    ({"group": {"size": 4, "redundant": 8}}, 1, "group.id", "shared by the 8 requests"),
    ({"darts": []}, 8, "darts", "a mapping of flags"),
    ({"duet": {"eps": 0.0}}, 1, "duet.eps", "float in [1e-06, 1]"),
    ({"duet": {"k1": 50, "k2": 10}}, 1, "duet.k1", "K1 <= K2"),
    ({"duet": {"marker": "latex"}}, 1, "duet.marker", "one of 'math', 'code', 'qa'"),
    ({"duet": {"pattern": "(?=lookahead)"}}, 1, "duet.pattern", "an RE2 regular expression"),
    ({"duet": {"pattern": "x" * 300}}, 1, "duet.pattern", "at most 256 characters"),
])
def test_bad_flags_name_the_flag_and_the_range(raw, n, flag, allowed):
    with pytest.raises(FlagError) as err:
        normalize(raw, n=n)
    assert err.value.flag == flag
    assert allowed in err.value.allowed
    assert f"'{flag}'" in str(err.value) and allowed in str(err.value)


def test_bad_json_and_dotted_forms():
    with pytest.raises(FlagError, match="invalid JSON"):
        extract({"vllm_rl": "{not json"})
    with pytest.raises(FlagError, match="malformed dotted flag"):
        extract({"vllm_rl.darts": "shortest"})


def test_rl_params_checks_at_the_call_site():
    with pytest.raises(FlagError, match="darts.k"):
        rl_params(group={"size": 2}, darts={"k": 3})


def test_das_section_defaults_and_problem_id():
    from vllm_rl.flags import normalize, parse

    c = normalize({"das": {}})
    assert c["das"] == {"problem_id": None, "policy": None, "budget": None, "min_prob": None}
    assert "group" not in c                       # DAS needs no group
    from vllm_rl.das.config import default_problem_id, prompt_problem_id

    named = {"group": {"id": "uid-7", "size": 4}, "das": {}}
    assert normalize(named)["das"]["problem_id"] is None   # set at submission:
    assert default_problem_id(named, [1, 2]) == "uid-7"    # a group the caller named
    assert default_problem_id({"das": {}}, [1, 2]) == prompt_problem_id([1, 2])
    unnamed = normalize({"das": {}}, n=8, default_group_id="req-1")
    assert unnamed["das"]["problem_id"] is None
    for canonical in (normalize(named), unnamed):
        assert normalize(canonical) == canonical           # a fixed point
    f = parse(normalize({"das": {"problem_id": "p3", "policy": "optimal", "budget": 2}})).das
    assert (f.problem_id, f.policy, f.budget, f.min_prob) == ("p3", "optimal", 2, None)


@pytest.mark.parametrize("das, flag", [
    ({"policy": "greedy"}, "das.policy"), ({"budget": -1}, "das.budget"),
    ({"budget": 65}, "das.budget"), ({"min_prob": 1.5}, "das.min_prob"),
    ({"window": 8}, "das.window"), ({"problem_id": 3}, "das.problem_id"),
])
def test_bad_das_flags_name_the_flag(das, flag):
    with pytest.raises(FlagError) as err:
        rl_params(das=das)
    assert err.value.flag == flag and "allowed" in str(err.value)
