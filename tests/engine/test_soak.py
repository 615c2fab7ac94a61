"""Soak: a bounded, seeded storm of valid and invalid flag sets against a live server.

One ``python -m vllm_rl.serve`` (the DAS drafter and an ARRoL head, so every section is
valid; shared with ``tests/engine/test_metrics.py``) on loopback gets, from several client
threads at once: random valid flag sets of every section (group, darts, duet, das,
arrol) in the JSON and the dotted form, streamed and not, some aborted by the client at
a random point; groups sent as single requests (one ``group.id``, ``group.size`` /
``redundant``); flagless requests; and invalid sets with exactly one bad flag.  It
asserts: no 5xx ever; every invalid set gets a real HTTP 400 naming its flag, streamed
or not (``vllm_rl.http_flags`` checks the flags before vLLM starts the response, DAS
budget against the server's drafter included: never 200 headers and an in-stream error
event); every returned
record agrees with its tokens (length, reason against finish_reason, weight, the
techniques' fields); the RL counters on ``/metrics`` cover every returned record and
count every accepted flagged sample exactly once;
afterwards nothing runs or waits and the KV cache is empty; and a flagless seeded
request gives the same tokens before and after.  ``SEED`` makes a failure reproduce:
the storm is ``JOBS`` seeded jobs, every one of them run to its end on any machine
(bounded by a count, never by a clock), and every client abort is decided by the seed:
a streamed request closed after a seeded number of chunks (it is in the engine and has
produced output), never a timeout.
"""
import json
import random
import threading
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from server_fixture import DAS, call, shared_server, stream, wait_idle
from vllm_rl import Reason, RolloutInfo
from vllm_rl.metrics import total
from vllm_rl.task import MODEL_PATH

pytestmark = pytest.mark.engine

SEED = 20261122
JOBS = 500          # jobs in the storm, fixed by SEED, all of them run
CLIENTS = 6         # concurrent client threads
KINDS = ("valid", "invalid", "single_group", "flagless")
DAS_BUDGET = 4      # the engine's b (DASConfig default)
assert "budget" not in DAS


# --------------------------------------------------------------------- flag sets
def valid_flags(rng: random.Random, n: int, size: int | None = None) -> dict:
    """A random valid set of sections for a request of ``n`` samples (``size``: a group
    sent as single requests names its own group section)."""
    raw: dict = {}
    m = size if size is not None else rng.randint(1, n)
    if size is None and (n > 1 or rng.random() < 0.3) and rng.random() < 0.7:
        raw["group"] = {"size": m}
        if n > 1 and rng.random() < 0.5:
            raw["group"]["redundant"] = n
    if rng.random() < 0.5:
        raw["darts"] = {"mode": rng.choice(["auto", "dual_end", "shortest"])}
        if rng.random() < 0.5:
            raw["darts"]["k"] = rng.randint(0, m)
        if rng.random() < 0.3:
            raw["darts"]["m_up"] = rng.randint(m, 2 * m + 2)
        raw.setdefault("group", {"size": m} if size is None else {})
    if rng.random() < 0.5:
        d = {}
        if rng.random() < 0.5:
            d["marker"] = rng.choice(["math", "code", "qa"])
        elif rng.random() < 0.5:
            d["pattern"] = r"\\boxed\{[^}]*\}"
        if rng.random() < 0.7:
            d["k1"] = rng.randint(0, 24)
            d["k2"] = rng.randint(d["k1"], 40)
        if rng.random() < 0.7:
            d["grace"] = rng.randint(0, 12)
        if rng.random() < 0.5:
            d["eps"] = rng.choice([0.05, 0.3, 0.5, 1.0])
        if rng.random() < 0.3:
            d["poll"] = rng.randint(1, 8)
        raw["duet"] = d
    if rng.random() < 0.4:
        d = {}
        if rng.random() < 0.5:
            d["problem_id"] = f"soak-{rng.randint(0, 3)}"
        if rng.random() < 0.5:
            d["policy"] = rng.choice(["class", "optimal", "fixed"])
        if rng.random() < 0.5:
            d["budget"] = rng.randint(0, DAS_BUDGET)
        if rng.random() < 0.3:
            d["min_prob"] = rng.choice([0.0, 0.1, 0.5])
        raw["das"] = d
    if rng.random() < 0.4:
        lo = rng.choice([0.0, 0.1, 0.3])
        raw["arrol"] = {"l_detect": rng.randint(1, 40), "kappa": rng.random(),
                        "rho": rng.random(), "lam": rng.uniform(0, 2),
                        "p_min": lo, "p_max": rng.uniform(lo, 1.0),
                        "return_hidden": rng.random() < 0.3}
    return raw


def invalid_flags(rng: random.Random, n: int) -> tuple[dict, str]:
    """A valid set with exactly one bad flag, and the flag the 400 must name."""
    raw = valid_flags(rng, n)
    m = (raw.get("group") or {}).get("size", n)
    bad = rng.choice([
        ("group", "size", rng.choice([0, 4097, "3", 2.5]), "group.size"),
        ("group", "id", 7, "group.id"),
        ("group", "bogus", 1, "group.bogus"),
        ("group", "redundant", n + 1 if n > 1 else 0, "group.redundant"),
        ("darts", "mode", "longest", "darts.mode"),
        ("darts", "k", m + 1, "darts.k"),
        ("darts", "m_up", 0, "darts.m_up"),
        ("duet", "marker", "latex", "duet.marker"),
        ("duet", "eps", rng.choice([0.0, 1.5]), "duet.eps"),
        ("duet", "poll", 0, "duet.poll"),
        ("duet", "grace", -1, "duet.grace"),
        ("duet", "pattern", rng.choice(["(", "a" * 300]), "duet.pattern"),
        ("duet", "k1", None, "duet.k1"),                     # k1 > k2
        ("das", "policy", "best", "das.policy"),
        ("das", "budget", rng.choice([DAS_BUDGET + 1, 65]), "das.budget"),
        ("das", "min_prob", 1.5, "das.min_prob"),
        ("das", "problem_id", 3, "das.problem_id"),
        ("arrol", "l_detect", 0, "arrol.l_detect"),
        ("arrol", "kappa", 1.5, "arrol.kappa"),
        ("arrol", "lam", 17, "arrol.lam"),
        ("arrol", "p_min", None, "arrol.p_min"),              # p_min > p_max
        ("arrol", "return_hidden", "yes", "arrol.return_hidden"),
        ("medusa", None, None, "medusa"),
        ("vllm_rl", None, None, "vllm_rl"),                  # not JSON at all
    ])
    section, key, value, flag = bad
    if flag == "vllm_rl":
        return raw, flag
    if key is None:
        raw[section] = {}
        return raw, flag
    sec = raw.setdefault(section, {})
    if flag == "duet.k1":
        sec.update(k1=30, k2=10)
    elif flag == "arrol.p_min":
        sec.update(p_min=0.9, p_max=0.2)
    else:
        sec[key] = value
    return raw, flag


def xargs(rng: random.Random, raw: dict) -> dict:
    """The JSON form or, for sets that have one (no empty section, no boolean),
    sometimes the dotted form."""
    flat = raw and all(sec and all(isinstance(v, (int, float, str)) and not isinstance(v, bool)
                                   for v in sec.values()) for sec in raw.values())
    if flat and rng.random() < 0.4:
        return {f"vllm_rl.{s}.{k}": v for s, sec in raw.items() for k, v in sec.items()}
    return {"vllm_rl": json.dumps(raw)}


# --------------------------------------------------------------------- checks
EARLY_ZERO = (Reason.DARTS_CANCELLED, Reason.DUET_ABORTED, Reason.ARROL_PRUNED)
FINISH = {Reason.EOS: "stop", Reason.STOP: "stop", Reason.LENGTH: "length"}


def check_choice(c: dict, raw: dict | None, max_tokens: int, group_id: str | None) -> list[str]:
    """What is wrong with one returned choice (empty: nothing)."""
    bad = []
    record = c.get("rollout_info")
    info = None if record is None else RolloutInfo.from_json(record)
    where = f"choice {c.get('index')} ({c['finish_reason']}, {c['stop_reason']!r:.200})"
    if isinstance(c["stop_reason"], str) and c["stop_reason"].startswith("vllm_rl"):
        bad.append(f"{where}: the record's carrier reached the client")
    n_tokens = len(c["token_ids"])
    if raw is None:
        if info is not None:
            bad.append(f"{where}: a flagless request got a record")
        return bad
    if info is None:     # only a stop string found by the front end ends without one
        if not (c["finish_reason"] == "stop" and isinstance(c["stop_reason"], str)):
            bad.append(f"{where}: a flagged sample without a record")
        return bad
    if info.length != n_tokens:
        bad.append(f"{where}: length {info.length} != {n_tokens} tokens")
    if info.length > max_tokens:
        bad.append(f"{where}: length above max_tokens {max_tokens}")
    want = FINISH.get(info.reason, "abort")
    if info.reason is Reason.ABORT or c["finish_reason"] != want:
        bad.append(f"{where}: reason {info.reason.value} with finish_reason {c['finish_reason']}")
    if info.reason is Reason.LENGTH and info.length != max_tokens:
        bad.append(f"{where}: length end at {info.length} of {max_tokens}")
    if info.reason in EARLY_ZERO:
        weight = 0.0
    else:
        weight = 1.0 / info.keep_prob if info.keep_prob else 1.0
    if abs(info.weight - weight) > 1e-9 * max(1.0, weight):
        bad.append(f"{where}: weight {info.weight}, want {weight}")
    if group_id is not None and info.group_id != group_id:
        bad.append(f"{where}: group {info.group_id}, sent {group_id}")
    duet, das, arrol = raw.get("duet"), raw.get("das"), raw.get("arrol")
    if (duet is None) != (info.keep_prob is None):
        bad.append(f"{where}: DUET fields {info.keep_prob} for duet={duet}")
    if info.reason in (Reason.DUET_TRIMMED, Reason.DUET_ABORTED) and duet is None:
        bad.append(f"{where}: {info.reason.value} without duet flags")
    if info.reason is Reason.DUET_TRIMMED and info.marker_pos is None:
        bad.append(f"{where}: trimmed with no marker position")
    if info.reason is Reason.DUET_ABORTED and duet and "k2" in duet:
        if info.length < duet["k2"] + duet.get("grace", 150):
            bad.append(f"{where}: aborted before the gate K2 + G")
    if info.reason is Reason.DARTS_CANCELLED and "darts" not in raw:
        bad.append(f"{where}: cancelled without darts flags")
    if (das is None) != (info.draft_proposed is None):
        bad.append(f"{where}: DAS fields {info.draft_proposed} for das={das}")
    elif das is not None and not 0 <= info.draft_accepted <= info.draft_proposed:
        bad.append(f"{where}: drafts accepted {info.draft_accepted} of {info.draft_proposed}")
    if info.score is not None and arrol is None:
        bad.append(f"{where}: an ARRoL score without arrol flags")
    if info.reason is Reason.ARROL_PRUNED:
        if not info.pruned or info.length < arrol["l_detect"]:
            bad.append(f"{where}: pruned at {info.length} with l_detect {arrol['l_detect']}")
    elif info.pruned:
        bad.append(f"{where}: pruned but ended {info.reason.value}")
    if arrol is not None and info.score is not None and arrol["return_hidden"] != (
            info.hidden_id is not None):
        bad.append(f"{where}: hidden state kept {info.hidden_id is not None}, "
                   f"asked {arrol['return_hidden']}")
    return bad


def check_group(infos: list[RolloutInfo], raw: dict, n: int) -> list[str]:
    """An early-stop DARTS group that cancelled members had its M valid samples."""
    if "darts" not in raw or not any(i.reason is Reason.DARTS_CANCELLED for i in infos):
        return []
    m = raw.get("group", {}).get("size", n)
    valid = sum(i.valid for i in infos)
    return [] if valid >= m else [f"group cancelled with {valid} valid < M = {m}"]


# --------------------------------------------------------------------- the storm
def job_plan(job: int) -> tuple[random.Random, str]:
    """Job ``job``'s random stream and its kind (the first draw), fixed by ``SEED``."""
    rng = random.Random(SEED * 1000 + job)
    return rng, rng.choices(KINDS, [5, 3, 2, 1])[0]


class Storm:
    """The client side: runs one seeded job per call and collects what went wrong."""

    def __init__(self, base: str, prompts: list[str]):
        self.base, self.prompts = base, prompts
        self.lock = threading.Lock()
        self.problems: list[str] = []
        self.records: list[RolloutInfo] = []     # returned records of flagged samples
        self.sent_flagged = 0                     # flagged samples accepted (200)
        self.closed_flagged = 0                   # of those, in streams the client closed
        self.statuses: list[int] = []
        self.kinds: Counter = Counter()           # jobs run to their end, by kind

    def fail(self, job: int, msg: str) -> None:
        with self.lock:
            self.problems.append(f"job {job} (seed {SEED}): {msg}")

    def body(self, rng, n: int, max_tokens: int) -> dict:
        b = {"model": str(MODEL_PATH), "prompt": rng.choice(self.prompts), "n": n,
             "temperature": 1.0, "max_tokens": max_tokens, "seed": rng.randint(0, 1 << 30),
             "return_token_ids": True}
        if rng.random() < 0.15:
            b["stop"] = ["="]
        return b

    def send(self, job: int, rng, body: dict, abort: bool):
        """POST, streamed or not; a client abort is streamed and closes the connection
        after a seeded number of chunks.  Returns (status, response, aborted)."""
        if rng.random() < 0.5 or abort:
            stop_after = rng.randint(1, 6) if abort else None
            status, resp, aborted = stream(self.base, body, stop_after=stop_after)
        else:
            status, resp = call(self.base, "/v1/completions", body)
            aborted = False
        with self.lock:
            self.statuses.append(status)
        if status >= 500:
            self.fail(job, f"HTTP {status}: {json.dumps(resp)[:400]}")
        return status, resp, aborted

    def run(self, job: int) -> None:
        rng, kind = job_plan(job)
        if kind == "single_group":
            self.single_group(job, rng)
        else:
            self.single_request(job, rng, kind)
        with self.lock:
            self.kinds[kind] += 1

    def single_request(self, job: int, rng, kind: str) -> None:
        n = rng.choice([1, 2, 4, 6])
        max_tokens = rng.randint(16, 96)
        body = self.body(rng, n, max_tokens)
        abort = kind != "invalid" and rng.random() < 0.25
        raw, flag = None, None
        if kind == "valid":
            raw = valid_flags(rng, n)
        elif kind == "invalid":
            raw, flag = invalid_flags(rng, n)
        if raw is not None:
            body["vllm_xargs"] = xargs(rng, raw) if flag != "vllm_rl" else {"vllm_rl": "{oops"}
        status, resp, aborted = self.send(job, rng, body, abort)
        if status >= 500:
            return
        if flag is not None:
            if status != 400 or resp.get("in_stream") or f"'{flag}'" not in json.dumps(resp):
                self.fail(job, f"invalid {flag} in {raw}: HTTP {status} {json.dumps(resp)[:300]}")
            return
        if status != 200:
            return self.fail(job, f"valid {raw}: HTTP {status} {json.dumps(resp)[:300]}")
        if raw is not None:
            with self.lock:
                self.sent_flagged += n
                self.closed_flagged += n if aborted else 0
        if aborted:
            return
        self.check(job, resp["choices"], raw, max_tokens, None, n)

    def single_group(self, job: int, rng) -> None:
        """M' single requests of one named group, sent at once."""
        redundant = rng.randint(2, 6)
        size = rng.randint(1, redundant)
        gid = f"soak-{SEED}-{job}"
        raw = valid_flags(rng, 1, size=size)
        raw["group"] = {"id": gid, "size": size, "redundant": redundant}
        max_tokens = rng.randint(16, 96)
        prompt = rng.choice(self.prompts)
        results = [None] * redundant
        subs = [random.Random(rng.random()) for _ in range(redundant)]

        def member(i):
            body = {**self.body(subs[i], 1, max_tokens), "prompt": prompt}
            body["vllm_xargs"] = xargs(subs[i], raw)
            try:
                results[i] = self.send(job, subs[i], body, subs[i].random() < 0.15)
            except Exception as e:  # noqa: BLE001 - reported below
                results[i] = e

        threads = [threading.Thread(target=member, args=(i,)) for i in range(redundant)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        choices = []
        for i, result in enumerate(results):
            if isinstance(result, Exception):
                self.fail(job, f"group member {i} got no answer: {result!r}")
                continue
            status, resp, aborted = result
            if status < 500 and status != 200:
                self.fail(job, f"group member {raw}: HTTP {status} {json.dumps(resp)[:300]}")
            if status == 200:
                with self.lock:
                    self.sent_flagged += 1
                    self.closed_flagged += 1 if aborted else 0
                if not aborted:
                    choices += resp["choices"]
        whole = len(choices) == redundant
        self.check(job, choices, raw, max_tokens, gid, redundant if whole else None)

    def check(self, job, choices, raw, max_tokens, group_id, n) -> None:
        infos = []
        for c in choices:
            for msg in check_choice(c, raw, max_tokens, group_id):
                self.fail(job, f"{raw}: {msg}")
            if raw is not None:
                infos.append(RolloutInfo.from_openai_choice(c))
        if raw is not None and n is not None and len(infos) == n:
            for msg in check_group(infos, raw, n):
                self.fail(job, f"{raw}: {msg}")
        with self.lock:
            self.records += infos


@pytest.fixture(scope="module")
def server():
    return shared_server()


def _flagless(base: str, prompt: str) -> list:
    body = {"model": str(MODEL_PATH), "prompt": prompt, "n": 2, "temperature": 1.0,
            "max_tokens": 48, "seed": 4242, "return_token_ids": True}
    status, resp = call(base, "/v1/completions", body)
    assert status == 200, resp
    return [(c["token_ids"], c["text"], c["finish_reason"]) for c in resp["choices"]]


def test_soak_storm(server, prompts):
    from vllm_rl.arrol.rule import BINS

    before_tokens = _flagless(server, prompts[7])
    cal = {"pos": [0] * BINS, "neg": [0] * BINS, "alpha": 1.0, "prior": 0.5, "delta": 0.0,
           "bins": BINS}
    assert call(server, "/vllm_rl/arrol", {"calibration": cal})[0] == 200   # ARRoL prunes
    before = wait_idle(server)
    storm = Storm(server, prompts)
    plan = Counter(job_plan(i)[1] for i in range(JOBS))
    assert set(plan) == set(KINDS), plan          # the seed's job list has every kind

    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(storm.run, range(JOBS)))    # a job's exception fails the test here
    after = wait_idle(server)
    reasons = {r.value: sum(i.reason is r for i in storm.records) for r in Reason}
    print(f"soak: jobs {dict(storm.kinds)}, HTTP "
          f"{ {s: storm.statuses.count(s) for s in set(storm.statuses)} }, "
          f"records {reasons}, flagged samples accepted {storm.sent_flagged}")
    assert call(server, "/vllm_rl/arrol", {"cold_start": True})[0] == 200
    assert storm.problems == [], "\n".join(storm.problems[:30])
    assert storm.kinds == plan, (storm.kinds, plan)   # every job ran to its end
    assert all(s < 500 for s in storm.statuses)
    assert storm.records, "the storm returned no record"
    # nothing left behind
    assert total(after, "vllm:num_requests_running") == 0
    assert total(after, "vllm:num_requests_waiting") == 0
    assert total(after, "vllm:kv_cache_usage_perc") == 0
    assert urllib.request.urlopen(server + "/health", timeout=10).status == 200
    assert shared_server() == server            # the same server process, still alive
    # the counters saw every returned record, and no more samples than were accepted
    ended = {r: total(after, "vllm_rl:samples_ended_total", reason=r.value)
             - total(before, "vllm_rl:samples_ended_total", reason=r.value) for r in Reason}
    for r in Reason:
        seen = sum(i.reason is r for i in storm.records)
        assert ended[r] >= seen, (r, ended[r], seen)
    # every accepted flagged sample is counted exactly once, whatever ended it; a client
    # abort only where the client closed its stream (one that closed after its samples
    # ended counts them by their engine reasons)
    assert sum(ended.values()) == storm.sent_flagged, (ended, storm.sent_flagged)
    assert ended[Reason.ABORT] <= storm.closed_flagged, (ended, storm.closed_flagged)
    # a flagless seeded request is untouched by all of it
    assert _flagless(server, prompts[7]) == before_tokens
