"""Where the simulator's plan parts from the engine's (mlxlab.studies.sim_validation.divergence), on synthetic
step tables shaped like a validation's ``steps``."""

from mlxlab.studies.sim_validation.divergence import format_divergence, plan_divergences, plan_summary

COLS = ["start_s", "end_s", "phase", "decode_batch", "decode_context_tokens", "prefill_tokens",
        "prefill_context_tokens", "chunks", "joined", "dropped", "fused"]


def step(t, phase, b, pt):
    return [t, t + 0.01, phase, b, 0, pt, 0, 1 if pt else 0, 0, 0, False]


SAME = [step(0.0, "prefill", 0, 100), step(0.1, "decode", 1, 0), step(0.12, "decode", 1, 0)]
# a document arrives while the chat still decodes (mixed), or after it finished (prefill alone)
BESIDE = SAME[:2] + [step(0.2, "mixed", 1, 200)]
ALONE = SAME[:2] + [step(0.3, "prefill", 0, 200)]


def doc(runs):
    return {"steps": {"columns": COLS, "runs": runs}}


def test_the_first_step_that_differs_is_where_the_plans_part():
    d = plan_divergences(doc({"heldout-1/gate": {"engine": [ALONE], "sim": [BESIDE]}}))
    assert len(d) == 1 and d[0]["step"] == 2 and d[0]["same_steps"] == 2
    assert d[0]["engine"] == {"phase": "prefill", "decode_batch": 0, "prefill_tokens": 200}
    assert d[0]["sim"]["phase"] == "mixed" and d[0]["sim_t_s"] == 0.2
    assert "plans part at step 2: engine prefill b0 +200 tokens at 0.300 s | sim mixed b1" in format_divergence(d[0])


def test_a_run_one_side_ends_early_parts_where_it_ends_and_equal_runs_do_not_part():
    d = plan_divergences(doc({"a/p": {"engine": [SAME, SAME], "sim": [SAME, SAME[:2]]}}))
    assert [x["step"] for x in d] == [None, 2]
    assert d[1]["sim"] is None and "sim ended" in format_divergence(d[1])
    assert "same plan (3 steps)" in format_divergence(d[0])


def test_the_summary_counts_standard_and_held_out_runs_and_the_engines_own_repeats():
    runs = {"chat+long/interleave": {"engine": [SAME, SAME], "sim": [SAME, SAME]},
            "heldout-1/gate": {"engine": [ALONE, BESIDE, ALONE], "sim": [BESIDE, BESIDE, ALONE]}}
    s = plan_summary(doc(runs))
    assert s["standard"] == {"runs": 2, "same": 2, "parted_step_median": None, "engine_pairs": 1, "engine_same": 1}
    assert s["heldout"] == {"runs": 3, "same": 2, "parted_step_median": 2.0, "engine_pairs": 2, "engine_same": 1}
    assert plan_summary({}) == {g: {"runs": 0, "same": 0, "parted_step_median": None, "engine_pairs": 0,
                                    "engine_same": 0} for g in ("standard", "heldout")}
