"""A multi-turn session served with drafts and without: every turn identical, frame by frame."""

import torch

from harness import SAMPLED, plain_settings
from model_fixtures import REPEAT_PROMPT, engine
from verispec.config import DraftSettings
from verispec.sampling import top_logprobs
from verispec.session import Session


def _turns(sess, eng):
    """Runs the session script; returns every turn's ids, logprobs, finish reasons and per-token logits."""
    out = []
    logits_seen = []

    def grab(tok, entry):
        logits_seen.append(entry)

    def turn(prompt, max_tokens=24, sampling=None, logprobs=None, stop_after=None):
        s = plain_settings(max_tokens, sampling=sampling or plain_settings().sampling)
        seen = []

        def on_token(tok, entry):
            seen.append(tok)
            if stop_after is not None and len(seen) >= stop_after:
                return False
            return None
        r = sess.generate(prompt, s, on_token=on_token, logprobs=logprobs)
        out.append((r.ids, r.finish_reason, [(e.token, e.logprob, e.top) for e in r.logprobs or []],
                    r.stats["reused_tokens"], r.stats["pin_restored"]))
        return r

    p1 = REPEAT_PROMPT
    r1 = turn(p1)                                            # a repeating prompt
    p2 = p1 + r1.ids + [7, 11, 13]
    r2 = turn(p2, logprobs=3)                               # continuation: prefix reuse, logprobs
    p3 = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
    turn(p3, sampling=SAMPLED)                              # another prompt (pinned automatically), sampled
    p4 = p2 + r2.ids + [1, 2]
    turn(p4, max_tokens=17)                                 # continuation again; the end falls mid-verify often
    turn(p3 + [4, 4, 4], logprobs=2)                        # restores the pin of p3
    turn(p1 + [17, 7, 11], stop_after=5)                    # restores p1's pin; stopped by the client
    turn(p1 + [17, 7, 11, 13, 17], max_tokens=10)           # continuation of a cancelled turn
    return out


def _session(eng, drafts):
    return Session(eng, drafts, context=512, pin_slots=4)


def test_session_with_and_without_drafts_identical():
    eng = engine("qwen3_next", 4, mtp=True, vocab_size=32, aligned_head=True)
    plain = _turns(_session(eng, DraftSettings(lookup=False, mtp="off")), eng)
    drafted_sess = _session(eng, DraftSettings(lookup=True, mtp="on", mtp_drafts=2, gate=False, mtp_vocab=0))
    drafted = _turns(drafted_sess, eng)
    for i, (a, b) in enumerate(zip(plain, drafted)):
        assert a[0] == b[0], f"turn {i}: ids differ"
        assert a[1] == b[1], f"turn {i}: finish reason differs"
        assert a[2] == b[2], f"turn {i}: logprobs differ"
        assert a[3] == b[3] and a[4] == b[4], f"turn {i}: reuse differs"
    m = drafted_sess.metrics
    assert m["prefix_reuses"] >= 1 and m["pin_restores"] >= 1
    assert m["verifies"].get("mtp", 0) >= 1 and m["verifies"].get("lookup", 0) >= 1
    assert m["cancelled"] == 1


def test_session_state_equals_fresh_run():
    """After reuse and pin restores, a turn's ids equal those of a fresh plain run of its prompt
    (its logits too with prefill_batch off: the next test)."""
    eng = engine("qwen3_next", 4, mtp=True, vocab_size=32, aligned_head=True)
    sess = _session(eng, DraftSettings(lookup=True, mtp="on", mtp_drafts=3, gate=False, mtp_vocab=0))
    p1 = REPEAT_PROMPT
    r1 = sess.generate(p1, plain_settings(20))
    sess.generate([9, 8, 7, 6, 5, 4, 3], plain_settings(5))
    p2 = p1 + r1.ids + [5, 5]
    got = []
    sess.generate(p2, plain_settings(12), on_token=lambda t, e: got.append(t))
    fresh = eng.generate(p2, plain_settings(12), keep_logits=True)
    assert got == fresh.ids
    logits = []
    sess.generate(p2 + fresh.ids[:-1] + [3], plain_settings(4), logprobs=5,
                  on_token=lambda t, e: logits.append(e))
    fresh2 = eng.generate(p2 + fresh.ids[:-1] + [3], plain_settings(4), keep_logits=True)
    assert [e.token for e in logits] == fresh2.ids
    # a fresh run prefills the whole prompt in one batch, the session in pieces; the ids must agree
    # (bit-equal logits are promised between drafted and plain sessions, which share the pieces)
    assert all(torch.isfinite(torch.tensor(e.logprob)) for e in logits)


def test_asked_pins_outlive_automatic_ones():
    eng = engine("qwen3_next", 0)
    sess = _session(eng, DraftSettings(lookup=False, mtp="off"))
    sess.pin_slots = 2
    keep = [1, 2, 3, 4, 5]
    sess.generate(keep, plain_settings(3), pin=True)
    for p in ([9, 9, 9], [8, 8, 8], [7, 7, 7]):
        sess.generate(p, plain_settings(3))
    assert tuple(keep) in sess.pins and len(sess.pins) == 2
    r = sess.generate(keep + [6], plain_settings(3))
    assert r.stats["pin_restored"] and r.stats["reused_tokens"] == 5


def _full_logprobs(logits: torch.Tensor) -> list:
    return [(t, lp) for t, lp in top_logprobs(logits, logits.shape[-1])]


def test_prefill_batch_off_makes_a_turn_independent_of_the_history():
    """With prefill_batch off every prompt row runs the exact path, so a state reached by prefix
    reuse or by a pin restore is bit for bit a fresh run's: a turn's whole log-softmax at every
    position equals a fresh plain run's, whatever the session served before (the prompts are
    longer than 16 rows, where a batched prefill would take the fast kernels)."""
    eng = engine("qwen3_next", 4, mtp=True, vocab_size=32, aligned_head=True)
    drafts = DraftSettings(lookup=True, mtp="on", mtp_drafts=3, gate=False, mtp_vocab=0)
    sess = Session(eng, drafts, context=512, pin_slots=4, prefill_batch=False)
    vocab = eng.args.vocab_size

    def fresh(prompt, n):
        r = eng.generate(prompt, plain_settings(n, prefill_batch=False), keep_logits=True)
        return r.ids, [_full_logprobs(x) for x in r.logits]

    def served(prompt, n):
        r = sess.generate(prompt, plain_settings(n), logprobs=vocab)
        return r.ids, [[(t, lp) for t, lp in e.top] for e in r.logprobs], r.stats

    p1 = REPEAT_PROMPT
    r1 = sess.generate(p1, plain_settings(20))
    p2 = p1 + r1.ids + [5, 5] + list(range(3, 23))            # extends the transcript by 22 rows
    ids, lps, stats = served(p2, 12)
    assert stats["reused_tokens"] == len(p1) + len(r1.ids) - 1 and not stats["pin_restored"]
    assert (ids, lps) == fresh(p2, 12)
    sess.generate([9, 8, 7, 6, 5, 4, 3], plain_settings(5))
    p3 = p1 + [4] * 20                                         # restores p1's pin, then 20 rows
    ids, lps, stats = served(p3, 12)
    assert stats["pin_restored"] and stats["reused_tokens"] == len(p1)
    assert (ids, lps) == fresh(p3, 12)


def test_prefill_off_in_row_blocks_equals_one_row_at_a_time():
    """prefill_batch off feeds the prompt through the exact path 16 rows a forward; by row invariance
    that is the state one row a forward gives: every decoded position's logits equal bit for bit."""
    eng = engine("qwen3_next", 4, mtp=True, vocab_size=32, aligned_head=True)
    prompt = (REPEAT_PROMPT * 3)[:45]                      # 16 + 16 + 13 rows
    got = {}
    for rows in (16, 1, 7):
        dec = eng.new_decoder(plain_settings(10, prefill_batch=False), prompt)
        dec.config.prefill_rows = rows
        r = eng.generate(prompt, plain_settings(10, prefill_batch=False), decoder=dec, keep_logits=True)
        got[rows] = (r.ids, r.logits)
    for rows in (1, 7):
        assert got[rows][0] == got[16][0]
        assert all(torch.equal(a, b) for a, b in zip(got[rows][1], got[16][1])), rows


def test_prefill_batch_auto_is_batched_on_the_cpu():
    eng = engine("qwen3_next", 0)
    assert eng.prefill_batch(None) is True and eng.prefill_batch(False) is False
    assert eng.prefill_batch_from(None) == 0          # CUDA_BATCH_FROM is for CUDA only
    prompt = (REPEAT_PROMPT * 2)[:30]
    auto = eng.generate(prompt, plain_settings(4), keep_logits=True)
    batched = eng.generate(prompt, plain_settings(4, prefill_batch=True), keep_logits=True)
    assert all(torch.equal(a, b) for a, b in zip(auto.logits, batched.logits))


def test_the_help_states_the_cuda_threshold_the_engine_uses():
    from verispec.cli import build_parser
    from verispec.engine import CUDA_BATCH_FROM

    text = build_parser().format_help() + "".join(
        a.help or "" for act in build_parser()._subparsers._group_actions for sp in act.choices.values()
        for a in sp._actions if "--prefill-batch" in a.option_strings)
    assert text.count(f"under {CUDA_BATCH_FROM} tokens on CUDA") == 2
