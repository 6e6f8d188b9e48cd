"""The drafts-vs-no-drafts matrix as one callable, so any engine (CPU fp32, the padded bf16
policy on the CPU, CUDA) runs the same arms: forced lookup and MTP modes at several depths,
natural MTP at depths 1-3 and auto, MTP with lookup, the gate on, greedy and sampled.
Each arm must equal the plain run bit for bit (ids, text, torch.equal logits at every
position) and, for forced arms, hit exactly the counts the simulation predicts."""

from __future__ import annotations

from harness import GREEDY, SAMPLED, arm_settings, assert_same, counts, plain_settings, run, simulate_forced


def forced_modes(k: int) -> list[str]:
    return ["accept", "reject", "mixed", "cycle"] + [f"row{r}" for r in range(1, k + 1)]


def check_matrix(eng, prompt: list[int], n: int = 24, *, samplings=("greedy", "sampled"),
                 lookup_depths=(5, 2), mtp_depths=(1, 2, 3), log=print, prefill_batch: bool | None = None) -> int:
    """Runs every arm; returns how many arms were compared. Raises AssertionError on the first difference.
    prefill_batch: every arm's prompt through the batched kernels (True), the exact path (False), or the default."""
    done = 0
    for name in samplings:
        base = plain_settings(n, sampling=SAMPLED if name == "sampled" else GREEDY, prefill_batch=prefill_batch)
        plain = run(eng, prompt, base)
        ctx = eng.context_for(len(prompt), base)
        ref = tuple(plain.ids)
        for k in lookup_depths:
            for mode in forced_modes(k):
                arm = run(eng, prompt, arm_settings(base, lookup_drafts=k, force=mode, reference=ref))
                assert_same(plain, arm, f"{name} lookup k={k} {mode}")
                want = simulate_forced(plain.ids, len(prompt), ctx, k, mode, eng.args.vocab_size)
                assert counts(arm.stats) == want, f"{name} lookup k={k} {mode}: counts"
                done += 1
        if eng.has_mtp:
            for d in mtp_depths:
                for mode in forced_modes(d):
                    arm = run(eng, prompt, arm_settings(base, lookup=False, mtp="on", mtp_drafts=d, force=mode,
                                                        reference=ref))
                    assert_same(plain, arm, f"{name} mtp {d} forced {mode}")
                    done += 1
            natural = [dict(lookup=False, mtp="on", mtp_drafts=d, mtp_vocab=0) for d in (*mtp_depths, 0)]
            natural += [dict(lookup=True, mtp="on", mtp_drafts=2, mtp_vocab=0),
                        dict(lookup=True, mtp="on", mtp_drafts=0, mtp_vocab=0, gate=True)]
            for a in natural:
                arm = run(eng, prompt, arm_settings(base, **a))
                assert_same(plain, arm, f"{name} {a}")
                done += 1
        arm = run(eng, prompt, arm_settings(base, lookup=True, lookup_drafts=5, gate=True))
        assert_same(plain, arm, f"{name} lookup gate on")
        done += 1
        log(f"{name}: {done} arms equal to plain so far ({len(plain.ids)} tokens each)")
    return done
