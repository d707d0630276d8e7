"""The lessons' self-checking exercises (coa_lab/lessons/exercises): the checks judge, and every notebook's
exercise cells have a registered check and a collapsed solution. That each solution passes its
check and a near-miss fails it, with the lesson's own objects, is run after each notebook's smoke
run (tests/e2e/test_notebooks.py)."""

import inspect

import nbformat
import pytest

from coa_lab.lessons.exercises import EXERCISES, Verdict, check, wrong_answer
from coa_lab.lessons.exercises.notebook_cells import check_calls, self_test_cells, solutions
from coa_lab.paths import PROJECT_ROOT

NOTEBOOKS = sorted((PROJECT_ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _context_free(ex) -> bool:
    return all(p.default is not inspect.Parameter.empty for p in inspect.signature(ex.truth).parameters.values())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_has_a_registered_check_and_a_solution(path):
    nb = nbformat.read(path, as_version=4)
    calls, sols = check_calls(nb), solutions(nb)
    assert len(calls) >= 2, f"{path.name}: at least two exercises that check themselves"
    assert set(calls) == set(sols), f"{path.name}: checks without a solution or solutions without a check"
    for ex_id in calls:
        assert ex_id in EXERCISES, f"{path.name}: {ex_id} is not registered in coa_lab/lessons/exercises"
        assert ex_id.startswith(path.name[:2] + "."), f"{path.name}: {ex_id} belongs to another lesson"
    assert len(self_test_cells(nb)) == len(calls)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    first_check = next(i for i, src in enumerate(code) if "check(" in src)
    assert any("from coa_lab.lessons.exercises import check" in src for src in code[:first_check]), \
        f"{path.name}: `check` is imported before the first exercise uses it"


def test_every_registered_exercise_is_in_its_lesson():
    used = {ex_id for path in NOTEBOOKS for ex_id in check_calls(nbformat.read(path, as_version=4))}
    assert set(EXERCISES) == used, f"registered but in no lesson: {set(EXERCISES) - used}"


@pytest.mark.parametrize("ex_id", sorted(i for i, ex in EXERCISES.items() if _context_free(ex)))
def test_context_free_checks_accept_the_truth_and_reject_a_near_miss(ex_id):
    ex = EXERCISES[ex_id]
    assert check(ex_id, ex.truth()).ok
    assert not check(ex_id, wrong_answer(ex_id)).ok
    assert "Hint" in check(ex_id, wrong_answer(ex_id)).message


def test_unanswered_unknown_and_malformed_answers():
    v = check("04.clip", None)
    assert not v and "not answered yet" in v.message and EXERCISES["04.clip"].question in v.message
    with pytest.raises(KeyError, match="04.clip"):
        check("04.nope", 1)
    v = check("04.advantages", "four numbers")  # the wrong kind of answer: not yet, no traceback
    assert not v.ok and "Hint" in v.message
    assert check("04.advantages", {"grpo": (1.7320, -0.5773), "dr_grpo": (0.75, -0.25)}).ok  # 3-4 decimals do
    assert "right" in Verdict(True, "04.x: right.")._repr_html_() and not Verdict(False, "x")


def test_tensor_answers_are_accepted():
    import torch

    mask, adv = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]), torch.tensor([0.0, 1.0, -1.0])
    ratio = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.5, 1.25, 0.5], [0.7, 1.0, 1.0, 1.0]])
    # row 0: advantage 0, nothing; row 1: 1.5 and 1.25 are cut by a symmetric clip, 0.5 is not (a positive
    # advantage is never cut below); row 2: 0.7 is cut (a negative advantage below 0.8)
    assert check("04.grad_tokens", torch.tensor([0, 2, 1]), loss_mask=mask, adv=adv, ratio=ratio, clip_low=0.2).ok
    assert not check("04.grad_tokens", 3, loss_mask=mask, adv=adv, ratio=ratio, clip_low=0.2).ok


# ---- answers the lesson already prints or holds do not pass ----

def test_04_answers_are_not_the_lessons_printed_cases():
    import torch

    from coa_lab.rl import dapo

    # the clip window in probabilities: the recipe's bounds times 0.40, not the clip cell's ratio table
    assert check("04.clip", (0.512, 0.32)).ok
    assert not check("04.clip", (1.28, 0.8)).ok and not check("04.clip", (0.48, 0.32)).ok  # ratios; PPO's bound
    assert not check("04.clip", {0.3: [True] * 6, 0.1: [True, True, False, False, False, False]}).ok
    # the advantages cell prints a 4-sample group [1, 0, 0, 1]; its values are not the 2-of-8 group's
    printed = dapo.group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))[0].tolist()
    assert not check("04.advantages", {"grpo": (printed[0], printed[1]), "dr_grpo": (0.5, -0.5)}).ok
    # the clip cell's recipe-bound count (clip-higher's) is not the symmetric clip's
    mask, adv = torch.ones(1, 4), torch.tensor([1.0])
    ratio = torch.tensor([[1.0, 1.1, 1.25, 1.3]])
    recipe = EXERCISES["04.grad_tokens"].truth(loss_mask=mask, adv=adv, ratio=ratio, clip_low=0.28)
    assert recipe == [3] and check("04.grad_tokens", [2], loss_mask=mask, adv=adv, ratio=ratio, clip_low=0.2).ok
    assert not check("04.grad_tokens", recipe, loss_mask=mask, adv=adv, ratio=ratio, clip_low=0.2).ok


def test_05_mixed_tasks_is_not_pass_at_k_times_tasks():
    import types

    recs = [types.SimpleNamespace(task_id=t, reward=r) for t, r in
            [("a", 1.0), ("a", 0.0), ("b", 1.0), ("b", 1.0), ("c", 0.0), ("c", 0.0), ("d", 0.0), ("d", 1.0)]]
    solved_once = len({r.task_id for r in recs if r.reward == 1.0})  # pass@K x tasks, which the lesson prints
    assert solved_once == 3 and check("05.mixed_tasks", 2, records=recs).ok
    assert not check("05.mixed_tasks", solved_once, records=recs).ok


def test_06_per_sequence_share_is_not_read_off_the_lessons_table():
    from coa_lab.config import get_preset
    from coa_lab.planning.memory_plan import plan

    at8, at128 = EXERCISES["06.per_sequence_share"].truth()
    assert 0 < at8 < at128 < 1  # sharding divides only the per-parameter part
    p32 = plan(get_preset("multinode-32b"), 32).to_dict()  # the lesson's table plans 32 GPUs
    share32 = (p32["activations_gib"] + p32["logits_gib"]) / sum(
        p32[t] for t in ("weights_gib", "gradients_gib", "optimizer_gib", "activations_gib", "logits_gib"))
    assert at8 < share32 < at128 and not check("06.per_sequence_share", [share32, share32]).ok
    assert not check("06.per_sequence_share", ["activations_gib", "logits_gib"]).ok  # the old answer's kind


def test_02_half_budget_is_not_the_longest_kept_trajectory(tok):
    records = [_record(0, ONE), _record(1, TWO), _record(2, ONE + " More words here.")]
    lengths = sorted(len(tok(r.text, add_special_tokens=False)["input_ids"]) for r in records)
    right = EXERCISES["02.half_budget"].truth(kept=records, tok=tok)
    assert right == lengths[1] - 1 and check("02.half_budget", right, kept=records, tok=tok).ok
    assert not check("02.half_budget", lengths[-1], kept=records, tok=tok).ok  # every trajectory kept: the maximum


# ---- the 03 checks: an answer the lesson already prints or holds does not pass ----

@pytest.fixture(scope="module")
def tok():
    from coa_lab.config import ModelConfig
    from coa_lab.generation.models import load_tokenizer

    return load_tokenizer(ModelConfig().name)  # the embedded model's tokenizer (offline)


def _record(n: int, text: str):
    from coa_lab.trajectories import TrajectoryRecord

    return TrajectoryRecord(id=f"t{n}", task_id=f"lookup-{n}", source="teacher", profile="mhqa",
                            question="Who directed Mr. Arkadin?", answers=["Orson Welles"], text=text, reward=1.0)


ONE = ("<plan>Search.</plan>\n<wiki_search>Mr. Arkadin</wiki_search>\n<observation>(1) Mr. Arkadin: a 1955 film "
       "directed by Orson Welles.</observation>\n<think>Welles.</think>\n<answer>Orson Welles</answer>")
TWO = ("<plan>Search twice.</plan>\n<wiki_search>Arkadin</wiki_search>\n<observation>(1) Arkadin: a name."
       "</observation>\n<wiki_search>Mr. Arkadin film</wiki_search>\n<observation>(1) Mr. Arkadin: a 1955 film "
       "written and directed by Orson Welles, shot in Spain.</observation>\n<think>Welles.</think>\n"
       "<answer>Orson Welles</answer>")


def test_03_masked_split_counts_each_block_of_the_busiest_trajectory(tok):
    from coa_lab.training.sft import encode_example, record_messages

    records = [_record(0, ONE), _record(1, TWO), _record(2, ONE)]
    blocks = EXERCISES["03.masked_split"].truth(records=records, tok=tok)
    assert len(blocks) == 2 and blocks[1] > blocks[0] > 0
    enc = encode_example(tok, record_messages(records[1]), TWO)
    assert sum(blocks) == enc["n_observation_tokens"]
    assert check("03.masked_split", blocks, records=records, tok=tok).ok
    assert not check("03.masked_split", enc["n_observation_tokens"], records=records, tok=tok).ok  # the printed total
    assert not check("03.masked_split", [sum(blocks)], records=records, tok=tok).ok


def test_03_trained_tokens_asks_per_example_not_the_epoch_total(tok):
    from coa_lab.config import get_preset
    from coa_lab.training.sft import IGNORE_INDEX, encode_example, record_messages

    preset, records = get_preset("cpu-smoke"), [_record(0, ONE), _record(1, TWO)]
    per = [sum(label != IGNORE_INDEX for label in encode_example(tok, record_messages(r), r.text,
                                                                 preset.sft.max_length)["labels"]) for r in records]
    context = {"records": records, "tok": tok, "preset": preset}
    assert check("03.trained_tokens", [max(per), min(per)], **context).ok
    assert not check("03.trained_tokens", sum(per), **context).ok  # result.trained_tokens, echoed
    assert not check("03.trained_tokens", [sum(per), sum(per)], **context).ok


def test_03_loss_by_hand_asks_per_example_not_the_batch_mean():
    import types

    import torch

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.emb = torch.nn.Embedding(11, 11)

        def forward(self, input_ids, attention_mask=None):
            return types.SimpleNamespace(logits=self.emb(input_ids))

    batch = {"input_ids": torch.tensor([[1, 2, 3, 4, 0], [5, 6, 7, 8, 9]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]),
             "labels": torch.tensor([[-100, -100, 3, 4, -100], [-100, 6, 7, 8, 9]])}
    model = Tiny()
    right = EXERCISES["03.loss_by_hand"].truth(model=model, batch=batch)
    logits = model(batch["input_ids"]).logits[:, :-1]
    mean = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), batch["labels"][:, 1:].reshape(-1),
                                             ignore_index=-100).item()  # what the lesson prints as loss_padded
    assert abs((2 * right[0] + 4 * right[1]) / 6 - mean) < 1e-5  # weighted by their labelled tokens
    assert check("03.loss_by_hand", right, model=model, batch=batch).ok
    assert not check("03.loss_by_hand", mean, model=model, batch=batch).ok
    assert not check("03.loss_by_hand", [mean, mean], model=model, batch=batch).ok


def test_echoes_finds_a_held_object_equal_to_the_answer_and_nothing_else():
    import torch

    from coa_lab.lessons.exercises.registry import echoes

    held = {"printed": [0.75, -0.25], "table": {"a": 1.5}, "weights": torch.zeros(100_000), "_private": [0.75, -0.25],
            "answer_adv": [0.75, -0.25], "n": 3, "t": torch.tensor([0.75, -0.25])}
    assert echoes(held, [0.75, -0.25], skip="answer_adv") == ["printed", "t"]
    assert echoes(held, {"a": 1.5}) == ["table"]
    assert echoes(held, 3) == [] and echoes({"rate": 1.0}, 1.0) == []  # counts and 0/1 rates are not scanned
    assert echoes(held, [0.5, 0.5]) == []


def test_self_test_cells_refuse_an_answer_the_lesson_already_holds():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell('answer_adv = None\ncheck("04.advantages", answer_adv)'),
                nbformat.v4.new_markdown_cell('<details><summary>Solution · 04.advantages</summary>\n\n```python\n'
                                              'answer_adv = {"grpo": (1.732, -0.577), "dr_grpo": (0.75, -0.25)}\n'
                                              '```\n\n</details>')]
    (cell,) = self_test_cells(nb)
    ns = {"check": check, "wrong_answer": wrong_answer}
    exec(cell, ns)  # nothing held: the solution passes, the near-miss fails
    ns = {"check": check, "wrong_answer": wrong_answer, "shown": EXERCISES["04.advantages"].truth()}
    with pytest.raises(AssertionError, match="echoing"):
        exec(cell, ns)
