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
    assert c["das"] == {"problem_id": None, "policy": None, "budget": None, "min_prob": None,
                       "force": False}
    assert "group" not in c                       # DAS needs no group
    from vllm_rl.das.config import default_problem_id

    named = {"group": {"id": "uid-7", "size": 4}, "das": {}}
    assert normalize(named)["das"]["problem_id"] is None   # set at submission:
    assert default_problem_id("uid-7", [1, 2]) == "uid-7"  # a group the caller named
    assert default_problem_id(None, [1, 2]) == default_problem_id("", [1, 2])
    assert default_problem_id(None, [1, 2]).startswith("prompt:")
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


# ------------------------------------------------------------------ the one reader
def test_read_gives_the_same_flags_for_every_form():
    from vllm_rl.flags import RLFlags, read

    sections = {"group": {"size": 2}, "darts": {"mode": "shortest"},
                "arrol": {"l_detect": 24, "return_hidden": True}}
    forms = {
        "nested": {"vllm_rl": sections},
        "json": rl_xargs(**sections),
        "dotted": {"vllm_rl.group.size": 2, "vllm_rl.darts.mode": "shortest",
                   "vllm_rl.arrol.l_detect": 24, "vllm_rl.arrol.return_hidden": True},
        # what vLLM's vllm_xargs makes of a JSON true: the int 1
        "dotted_xargs": {"vllm_rl.group.size": 2, "vllm_rl.darts.mode": "shortest",
                         "vllm_rl.arrol.l_detect": 24, "vllm_rl.arrol.return_hidden": 1},
        "mixed": {"vllm_rl": json.dumps({"group": {"size": 2}, "darts": {}}),
                  "vllm_rl.darts.mode": "shortest", "vllm_rl.arrol.l_detect": 24,
                  "vllm_rl.arrol.return_hidden": 1},
    }
    read_ = {name: read(x, n=4, default_group_id="g") for name, x in forms.items()}
    first = read_["nested"]
    assert isinstance(first, RLFlags) and first.arrol.return_hidden is True
    assert all(f == first for f in read_.values()), read_
    # the canonical form the front end writes reads back to the same flags
    assert read({"vllm_rl": first.canonical()}) == first
    assert read({"vllm_rl": first.canonical()}, n=4) == first
    assert read(None) is None and read({}) is None and read({"other": 1}) is None


@pytest.mark.parametrize("value, ok", [
    (True, True), (False, False), (1, True), (0, False),    # 0 / 1: vllm_xargs's bools
    (2, None), (-1, None), (1.0, None), ("true", None), ([1], None),
])
def test_bool_flags_take_bools_and_the_ints_0_and_1(value, ok):
    from vllm_rl.flags import read

    x = {"vllm_rl.arrol.return_hidden": value}
    if ok is None:
        with pytest.raises(FlagError) as e:
            read(x)
        assert e.value.flag == "arrol.return_hidden" and "bool" in e.value.allowed
    else:
        assert read(x).arrol.return_hidden is ok


@pytest.mark.parametrize("extra_args, flag", [
    ({"vllm_rl.arrol.l_detect": 0}, "arrol.l_detect"),
    ({"vllm_rl.arrol.l_detect": "24"}, "arrol.l_detect"),         # numbers stay strings
    ({"vllm_rl.arrol.l_detect": 24.0}, "arrol.l_detect"),
    ({"vllm_rl.duet.eps": float("nan")}, "duet.eps"),
    ({"vllm_rl": {"arrol": {"kappa": 2}}}, "arrol.kappa"),
    ({"vllm_rl": '{"arrol": {"kappa": 2}}'}, "arrol.kappa"),
    ({"vllm_rl": "[1]"}, "vllm_rl"),
    ({"vllm_rl": 3, "vllm_rl.darts.mode": "shortest"}, "vllm_rl"),
    ({"vllm_rl.arrol": 1}, "arrol"),
    (["vllm_rl"], "vllm_rl"),
])
def test_read_raises_naming_the_flag(extra_args, flag):
    from vllm_rl.flags import read

    with pytest.raises(FlagError) as e:
        read(extra_args, n=1)
    assert e.value.flag == flag and "allowed" in str(e.value)


def test_read_leaves_the_callers_flags_alone():
    from vllm_rl.flags import read

    nested = {"darts": {"mode": "auto"}, "group": {"size": 2}}
    read({"vllm_rl": nested, "vllm_rl.darts.mode": "shortest"}, n=2)
    assert nested == {"darts": {"mode": "auto"}, "group": {"size": 2}}


def test_flag_reads_share_one_read_per_flags_text():
    """The scheduler's admissions: equal flags (a group's samples, each with its own
    copy) read once and shared; what a request id names, dotted keys and bad flags are
    read every time; the last ``size`` texts are kept."""
    from vllm_rl.flags import FlagReads, read

    reads = FlagReads(size=2)
    a = rl_params(group={"size": 2, "id": "g"}, das={"problem_id": "p"})
    first = reads.read(a, "r0", default_group_id="r0")
    again = reads.read(json.loads(json.dumps(a)), "r1", default_group_id="r1")
    assert again is first and first == read(a, default_group_id="r0")
    assert reads.read({**a, "other": 1}, "r1b", default_group_id="r1b") is first
    # unnamed group: named by each request's id, never shared
    b = rl_params(group={"size": 2}, das={})
    assert reads.read(b, "r2", default_group_id="r2").group.id == "r2"
    assert reads.read(b, "r3", default_group_id="r3").group.id == "r3"
    dotted = {"vllm_rl.duet.eps": 0.5}
    assert reads.read(dotted, "r4") is not reads.read(dotted, "r5")
    assert reads.read({"vllm_rl": {"arrol": {"kappa": 3}}}, "r6") is None
    for i in range(2):                                      # a pushes out of the cache
        reads.read(rl_params(das={"problem_id": f"q{i}"}), f"s{i}")
    assert reads.read(a, "r7", default_group_id="r7") is not first


def test_read_or_warn_logs_once_per_request_and_serves_without_flags(caplog):
    import logging

    from vllm_rl.flags import read_or_warn

    log = logging.getLogger("test.read_or_warn")
    bad = {"vllm_rl.arrol.kappa": 3}
    with caplog.at_level(logging.WARNING, logger="test.read_or_warn"):
        for _ in range(5):                   # a worker reading it every step
            assert read_or_warn(bad, "req-once", log) is None
        assert read_or_warn(bad, "req-other", log) is None
        assert read_or_warn({"vllm_rl.duet.eps": 0.5}, "req-good", log).duet.eps == 0.5
    warned = [r for r in caplog.records if r.name == "test.read_or_warn"]
    assert len(warned) == 2 and "'arrol.kappa'" in warned[0].getMessage()
    assert "req-once" in warned[0].getMessage() and "req-other" in warned[1].getMessage()


def test_every_flag_is_declared_once_and_documented():
    """Each flag is one field of its section's dataclass (type, range, default, citation):
    the reader's table is derived from it, and docs/flags.md's tables list every flag with
    its declared default."""
    from dataclasses import fields
    from pathlib import Path

    from vllm_rl import flags

    for section, table in ((flags.DuetFlags, flags.DUET_FIELDS), (flags.DasFlags, flags.DAS_FIELDS),
                           (flags.ArrolFlags, flags.ARROL_FIELDS)):
        assert [f.name for f in fields(section)] == list(table)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "flags.md").read_text()
    rows = {line.split("|")[1]: line for line in doc.splitlines() if line.startswith("| `")}
    for name, allowed, default, _ in flags.schema():
        row = next((r for k, r in rows.items() if f"`{name}`" in k), None)
        assert row is not None, f"{name} is not in docs/flags.md"
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            assert f"{default:g}" in row, (name, default, row)
